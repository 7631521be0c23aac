"""Small scenarios for the DES cross-checks: a 4-layer Llama-like model, fast to simulate."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sim.inputs.load import scenario_from_table
from sim.inputs.reading import read_toml
from sim.inputs.scenario import Scenario

TINY_MODEL = {"name": "tiny", "layers": 4, "hidden": 512, "heads": 8, "kv_heads": 8, "ffn_hidden": 1376,
              "vocab": 8000}

STRATEGIES: dict[str, dict] = {
    "ddp": {"engine": "ddp"},
    "ddp-zero-redundancy": {"engine": "ddp-zero-redundancy"},
    "ds-zero0": {"zero": {"stage": 0}},
    "ds-zero1": {"zero": {"stage": 1}},
    "ds-zero1-overlap": {"zero": {"stage": 1, "overlap_comm": True, "reduce_bucket_size": 2e6}},
    "ds-zero2": {"zero": {"stage": 2, "reduce_bucket_size": 2e6}},
    "ds-zero2-overlap": {"zero": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 2e6}},
    "ds-zero2-per-rank-reduce": {"zero": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 2e6,
                                          "use_multi_rank_bucket_allreduce": False}},
    "ds-zero2-offload": {"zero": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 2e6,
                                  "offload_optimizer": "cpu"}},
    "ds-zero3": {"zero": {"stage": 3, "stage3_max_reuse_distance": 0, "reduce_bucket_size": 2e6,
                          "stage3_prefetch_bucket_size": 0}},
    "ds-zero3-prefetch": {"zero": {"stage": 3, "reduce_bucket_size": 2e6, "stage3_prefetch_bucket_size": 1e6}},
    "ds-zero3-offload": {"zero": {"stage": 3, "stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0,
                                  "reduce_bucket_size": 2e6,
                                  "offload_optimizer": "cpu", "offload_param": "cpu"}},
    "ds-zero3-partial-offload": {"zero": {"stage": 3, "reduce_bucket_size": 2e6, "sub_group_size": 1_000_000,
                                          "offload_optimizer": {"device": "cpu", "ratio": 0.5, "pin_memory": False}}},
    "ddp-lora": {"engine": "ddp", "lora": {"r": 8, "target_modules": ["q_proj", "v_proj"]}},
    "ds-zero2-lora": {"zero": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 2e6},
                      "lora": {"r": 8, "target_modules": ["q_proj", "v_proj"]}},
    "ds-zero3-lora": {"zero": {"stage": 3, "stage3_max_reuse_distance": 0, "reduce_bucket_size": 2e6,
                               "stage3_prefetch_bucket_size": 0, "stage3_param_persistence_threshold": 1000},
                      "lora": {"r": 16, "target_modules": "all-linear"}},
    "fsdp2-lora": {"fsdp": {}, "lora": {"r": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}},
    "ds-zero3-qwz": {"zero": {"stage": 3, "stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0,
                              "reduce_bucket_size": 2e6, "zero_quantized_weights": True}},
    "ds-zero3-zeropp": {"zero": {"stage": 3, "stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0,
                                 "reduce_bucket_size": 2e6, "zero_quantized_weights": True,
                                 "zero_quantized_gradients": True, "zero_hpz_partition_size": 8}},
    "ds-zero3-lora-zeropp": {"zero": {"stage": 3, "stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0,
                                      "reduce_bucket_size": 2e6, "zero_quantized_weights": True,
                                      "zero_quantized_gradients": True, "zero_hpz_partition_size": 8},
                             "lora": {"r": 16, "target_modules": "all-linear"}},
    "ds-zero1-tp2-pp2": {"zero": {"stage": 1}, "parallel": {"tp": 2, "pp": 2}},
    "ddp-tp2-sequence-parallel": {"engine": "ddp", "parallel": {"tp": 2, "sequence_parallel": True}},
    "ds-zero3-tp2-full-recompute": {"zero": {"stage": 3, "stage3_max_reuse_distance": 0,
                                             "stage3_prefetch_bucket_size": 0}, "parallel": {"tp": 2}},
    "megatron": {"megatron": {}},
    "megatron-overlap": {"megatron": {"overlap_grad_reduce": True, "bucket_size": 1_000_000}},
    "megatron-distopt": {"megatron": {"distributed_optimizer": True}},
    "megatron-distopt-overlap-tp2": {"megatron": {"distributed_optimizer": True, "overlap_grad_reduce": True,
                                                  "overlap_param_gather": True, "tp_comm_overlap": True,
                                                  "bucket_size": 1_000_000},
                                     "parallel": {"tp": 2, "sequence_parallel": True}},
    "megatron-distopt-tp2-pp2": {"megatron": {"distributed_optimizer": True, "overlap_grad_reduce": True,
                                              "overlap_param_gather": True, "bucket_size": 1_000_000,
                                              "tp_comm_overlap": True},
                                 "parallel": {"tp": 2, "pp": 2, "sequence_parallel": True}},
    "megatron-distopt-tp2-pp2-v2": {"megatron": {"distributed_optimizer": True, "overlap_grad_reduce": True,
                                                 "overlap_param_gather": True, "bucket_size": 1_000_000},
                                    "parallel": {"tp": 2, "pp": 2, "virtual_stages": 2, "sequence_parallel": True}},
    "fsdp2": {"fsdp": {}},
    "fsdp2-no-reshard": {"fsdp": {"reshard_after_forward": False}},
    "fsdp2-reshard-root": {"fsdp": {"reshard_root": True}},
    "fsdp2-hsdp": {"fsdp": {"replicate_degree": 2}},
    "fsdp2-tp2": {"fsdp": {}, "parallel": {"tp": 2, "sequence_parallel": True}},
    "fsdp2-hsdp-reshard-2": {"fsdp": {"replicate_degree": 2, "reshard_after_forward": 2}},
    "fsdp2-pp2": {"fsdp": {"reshard_after_forward": False}, "parallel": {"pp": 2}},
    "fsdp2-tp2-pp2-hsdp": {"fsdp": {"reshard_after_forward": False, "replicate_degree": 2},
                           "parallel": {"tp": 2, "pp": 2, "sequence_parallel": True}},
    "ds-zero3-v05": {"zero": {"stage": 3, "deepspeed_version": "0.5", "stage3_max_reuse_distance": 0,
                              "reduce_bucket_size": 2e6, "stage3_prefetch_bucket_size": 0}},
    "ds-zero1-bf16-optimizer": {"zero": {"stage": 1, "grad_accum_dtype": "fp32"}},
    "ds-zero0-pp2-bf16-optimizer": {"zero": {"stage": 0}, "parallel": {"pp": 2}},
    "ds-zero1-pp2-first-1": {"zero": {"stage": 1}, "parallel": {"pp": 2, "first_stage_layers": 1}},
    "megatron-distopt-tp2-pp2-last-1": {"megatron": {"distributed_optimizer": True, "overlap_grad_reduce": True,
                                                     "bucket_size": 1_000_000},
                                        "parallel": {"tp": 2, "pp": 2, "last_stage_layers": 1}},
    "fsdp2-pp2-first-3": {"fsdp": {"reshard_after_forward": False}, "parallel": {"pp": 2, "first_stage_layers": 3}},
    "paper-zero0": {"zero": {"stage": 0}, "schedule": "paper"},
    "paper-zero1": {"zero": {"stage": 1}, "schedule": "paper"},
    "paper-zero2": {"zero": {"stage": 2}, "schedule": "paper"},
    "paper-zero3": {"zero": {"stage": 3}, "schedule": "paper"},
}


def tiny(strategy: str, *, nodes: int = 1, grad_accum: int = 2, recompute: str = "none",
         comm: dict | None = None, extra_zero: dict | None = None, model: dict | None = None,
         seq_len: int = 512, micro_batch: int = 2, strategy_table: dict | None = None) -> Scenario:
    parallel = (strategy_table or STRATEGIES[strategy]).get("parallel", {})
    if parallel.get("virtual_stages", 1) > 1:     # interleaving needs whole groups of pp micro-batches
        grad_accum = -(-grad_accum // parallel["pp"]) * parallel["pp"]
    table: dict = {"model": model or TINY_MODEL, "cluster": "dgx-a100-80g", "nodes": nodes,
                   "training": {"seq_len": seq_len, "micro_batch": micro_batch, "grad_accum": grad_accum,
                                "precision": "bf16", "recompute": recompute}}
    for key, value in (strategy_table or STRATEGIES[strategy]).items():
        table[key] = {**value} if isinstance(value, dict) else value
    if extra_zero:
        table["zero"] = {**table.get("zero", {}), **extra_zero}
    if comm:
        table["comm"] = comm
    return scenario_from_table(table, Path("tests/crosscheck/scenarios.py"), f"tiny-{strategy}")


def bundled(name: str) -> Scenario:
    path = Path(__file__).resolve().parents[2] / "scenarios" / f"{name}.toml"
    return scenario_from_table(read_toml(path), path, name)


def with_host(s: Scenario, **host: object) -> Scenario:
    """`s` with these fields of its node's host changed (`synchronous=True`: a CPU process,
    whose gloo calls block)."""
    h = replace(s.cluster.node.host, **host)
    return replace(s, cluster=replace(s.cluster, node=replace(s.cluster.node, host=h)))


def without_interference(s: Scenario) -> Scenario:
    """`s` with compute-communication interference off: the exactness checks of the engine's
    shortcuts compare op times to 1e-12, and interference makes up lost work in waits that
    stop within 1 ns of it (sim.des.interference; tests/crosscheck/test_interference_engine.py
    checks the engine with it on)."""
    gpu = replace(s.cluster.gpu, comm_interference=0.0)
    return replace(s, cluster=replace(s.cluster, node=replace(s.cluster.node, gpu=gpu)))


def without_host(s: Scenario) -> Scenario:
    """`s` with no host CPU costs (launches, collective calls, framework hooks) and no
    interference: the engine's links and streams alone, for identities of the overlap model."""
    return with_host(without_interference(s), launch=0.0, collective_launch=0.0, zero3_hook=0.0, fsdp2_hook=0.0)
