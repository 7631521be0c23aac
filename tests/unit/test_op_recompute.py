"""torchtitan's per-op selective checkpointing (`recompute = "selective-op"`) in the planner,
the memory report and the analytic twin; where it is refused; the fused-attention and
loss-backward memory it rests on."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.analytic import op_sac
from sim.analytic.activations import layer_activation_bytes, loss_backward_transient_bytes
from sim.core.enums import Recompute
from sim.core.errors import InputError
from sim.engines.schedule import Compute, Mem
from sim.inputs.load import scenario_from_table
from sim.results.memory_report import scenario_report
from sim.simulate import simulate
from sim.studies.check import check_rows, holds
from tests.crosscheck.scenarios import TINY_MODEL, tiny

GQA = {**TINY_MODEL, "kv_heads": 2}


def run(recompute: str, strategy: str = "fsdp2", **kw):
    return simulate(tiny(strategy, recompute=recompute, model=GQA, **kw))


def test_the_backward_runs_every_second_matmul_and_the_cheap_ops_again():
    none, per_op, full = (run(r) for r in ("none", "selective-op", "full"))
    assert none.breakdown.compute_s < per_op.breakdown.compute_s < full.breakdown.compute_s
    assert none.hardware_flops < per_op.hardware_flops < full.hardware_flops
    tokens = per_op.scenario.training.global_batch * per_op.scenario.training.seq_len
    extra = op_sac.recomputed_flops_per_token(per_op.scenario.model) * tokens * GQA["layers"]
    assert per_op.hardware_flops - none.hardware_flops == pytest.approx(extra, rel=1e-12)
    recomputes = [op for op in per_op.schedule.ops(0) if isinstance(op, Compute) and op.name.startswith("recompute")]
    assert {op.layer for op in recomputes if op.micro_step == 0} == set(range(GQA["layers"]))
    assert {k.name for op in recomputes for k in op.kernels if k.kind.value == "gemm"} == {
        "self_attn.k_proj", "self_attn.o_proj", "mlp.up_proj"}


def test_it_keeps_less_than_no_recomputation_and_more_than_full():
    peaks = {r: run(r, grad_accum=1).peak_pool().peak_breakdown.get(Mem.ACTIVATIONS, 0.0)
             for r in ("none", "selective-op", "full")}
    assert peaks["none"] > peaks["selective-op"] > peaks["full"]


@pytest.mark.parametrize("strategy", ["fsdp2", "ddp", "ddp-zero-redundancy"])
def test_des_agrees_with_the_twin_and_the_report_bounds_it(strategy):
    r = run("selective-op", strategy)
    for name, des, analytic, relation in check_rows(r):
        assert holds(des, analytic, relation), (name, des, analytic, relation)
    report = scenario_report(r.scenario).rows[0].activations_bytes
    assert report >= r.peak_pool().peak_breakdown.get(Mem.ACTIVATIONS, 0.0)


def table(**over) -> dict:
    base = {"model": GQA, "cluster": "dgx-h100", "nodes": 1, "fsdp": {},
            "training": {"seq_len": 512, "micro_batch": 2, "grad_accum": 1, "precision": "bf16",
                         "recompute": "selective-op"}}
    return {**base, **over}


@pytest.mark.parametrize(("change", "words"), [
    ({"fsdp": None, "zero": {"stage": 3}}, "engine deepspeed"),
    ({"fsdp": None, "engine": "megatron"}, "engine megatron"),
    ({"model": "mixtral-8x7b"}, "MoE experts"),
    ({"model": "gpt2"}, "biases"),
    ({"compute": {"attention": "unfused"}}, "unfused attention"),
])
def test_it_is_refused_where_it_is_not_simulated(change, words):
    t = table(**{k: v for k, v in change.items() if v is not None})
    for k, v in change.items():
        if v is None:
            del t[k]
    with pytest.raises(InputError) as err:
        scenario_from_table(t, Path("s.toml"), "s")
    text = str(err.value)
    assert "training.recompute" in text and "not simulated yet" in text and words in text


def test_fused_attention_keeps_no_scores():
    m = scenario_from_table(table(), Path("s.toml"), "s").model
    # without flash the scores grow with s^2; with it, activations grow linearly with s
    unfused = [layer_activation_bytes(m, s, 1) / s for s in (1024, 4096)]
    flash = [layer_activation_bytes(m, s, 1, flash=True) / s for s in (1024, 4096)]
    assert unfused[1] > 2 * unfused[0] and flash[0] == flash[1]
    lse = 4 * m.heads                                      # fp32 log-sum-exp per head and token
    assert flash[0] == layer_activation_bytes(m, 1024, 1, recompute=Recompute.SELECTIVE) / 1024 + lse


def test_the_loss_backward_peaks_on_top_of_the_kept_logits():
    m = scenario_from_table(table(), Path("s.toml"), "s").model
    s, b = 2048, 2
    assert loss_backward_transient_bytes(m, s, b) == 8 * s * b * m.vocab            # two fp32 gradients
    assert loss_backward_transient_bytes(m, s, b, megatron=True) == 2 * s * b * m.vocab   # in place, then cast
    assert loss_backward_transient_bytes(m, s, b, value_bytes=4, megatron=True) == 0
    r = simulate(scenario_from_table(table(), Path("s.toml"), "s"))
    ops = [op for op in r.schedule.ops(0) if isinstance(op, Compute) and any(a.label == "loss backward"
                                                                              for a in op.alloc)]
    assert ops and all(any(a.label == "loss backward" for a in op.free) for op in ops)   # allocated, then gone
