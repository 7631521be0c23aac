"""LoRA fine-tuning ([lora], PEFT's LoraConfig names): frozen 16-bit base, adapters with
their own gradients, traffic and optimizer state, no weight gradients for frozen weights."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.analytic.kernels import KernelKind
from sim.core.errors import InputError
from sim.core.model import module_tree
from sim.engines.schedule import Collective, Compute, Mem
from sim.inputs.load import scenario_from_table
from sim.results.memory_report import scenario_report
from sim.simulate import simulate

GB = 1e9
Q_V = {"r": 8, "target_modules": ["q_proj", "v_proj"], "lora_alpha": 16, "lora_dropout": 0.05}
ADAPTERS_7B = 32 * 2 * 8 * (4096 + 4096)      # layers x (q, v) x r x (in + out)


def table(engine: dict, lora: dict | None = Q_V, gpus: int = 4, model: object = "llama2-7b") -> dict:
    t = {"model": model, "cluster": "dgx-a100-80g", "nodes": 1, "gpus_per_node": gpus,
         "training": {"seq_len": 2048, "micro_batch": 1, "global_batch": 8, "precision": "bf16",
                      "recompute": "full"}, **engine}
    if lora is not None:
        t["lora"] = lora
    return t


def scenario(engine: dict, lora: dict | None = Q_V, **kw):
    return scenario_from_table(table(engine, lora, **kw), Path("s.toml"), "s")


def grad_bytes(result) -> float:
    return sum(op.nbytes for op in result.schedule.ops() if isinstance(op, Collective) and op.purpose.startswith("grad")
               and op.purpose != "grad norm")


def test_the_adapters_are_peft_modules_and_the_only_trainable_tensors():
    mods = module_tree(scenario({"zero": {"stage": 2}}).model)
    names = {m.name for m in mods}
    assert {"model.layers.0.self_attn.q_proj.base_layer", "model.layers.0.self_attn.q_proj.lora_A.default",
            "model.layers.0.self_attn.q_proj.lora_B.default"} <= names
    assert "model.layers.0.self_attn.k_proj" in names            # not targeted: unwrapped, frozen
    trainable = [t for m in mods for t in m.tensors if t.trainable]
    assert sum(t.numel for t in trainable) == ADAPTERS_7B == 4_194_304
    assert all(".lora_" in t.name for t in trainable)
    a = next(m for m in mods if m.name.endswith("layers.0.self_attn.q_proj.lora_A.default"))
    assert a.tensors[0].shape == (8, 4096)


def test_a_string_target_is_a_regular_expression_on_the_whole_name_as_in_peft():
    s = scenario({"zero": {"stage": 2}}, lora={"r": 8, "target_modules": r".*\.(q|v)_proj"})
    trainable = sum(t.numel for m in module_tree(s.model) for t in m.tensors if t.trainable)
    assert trainable == ADAPTERS_7B
    with pytest.raises(InputError, match="matches no Linear"):
        scenario({"zero": {"stage": 2}}, lora={"r": 8, "target_modules": "q_proj"})   # not the whole name


def test_llama2_7b_lora_zero2_on_4_gpus_holds_the_frozen_base_and_almost_no_optimizer_state():
    r = simulate(scenario({"zero": {"stage": 2}}))
    res = r.schedule.classes[0].resident
    base = next(a for a in res if a.label.startswith("frozen base"))
    assert base.nbytes / GB == pytest.approx(13.5, abs=0.05)    # 6.74 B parameters x 2 B on every GPU
    optimizer = sum(a.nbytes for a in res if a.category is Mem.OPTIMIZER)
    assert optimizer == pytest.approx(12.0 * ADAPTERS_7B / 4, rel=0.01)   # fp32 master + m + v, / dp
    assert optimizer < 0.02 * GB
    # the adapter gradients are the only gradient traffic: ZeRO-2 all-reduces each micro-step's
    full = simulate(scenario({"zero": {"stage": 2}}, lora=None))
    accum = r.scenario.training.grad_accum
    assert grad_bytes(r) == pytest.approx(accum * 2.0 * ADAPTERS_7B, rel=0.01)
    assert grad_bytes(full) / grad_bytes(r) > 1000
    assert r.step_time_s < full.step_time_s


@pytest.mark.parametrize("engine", [{"engine": "ddp"}, {"zero": {"stage": 2}}, {"zero": {"stage": 3}}, {"fsdp": {}}])
def test_frozen_weights_compute_no_weight_gradients(engine):
    def gemm_flops(result) -> float:
        return sum(k.flops for op in result.schedule.ops() if isinstance(op, Compute) for k in op.kernels
                   if k.kind is KernelKind.GEMM)
    lora = simulate(scenario(engine))
    full = simulate(scenario(engine, lora=None))
    # forward + recomputed forward + input gradient = 3 of the 4 Linear passes (+ the small adapters)
    assert gemm_flops(lora) / gemm_flops(full) == pytest.approx(3 / 4, abs=0.01)
    assert lora.model_flops < full.model_flops


def test_zero3_and_fsdp2_still_gather_the_frozen_base_and_reduce_only_the_adapters():
    for engine in ({"zero": {"stage": 3}}, {"fsdp": {}}):
        lora, full = simulate(scenario(engine)), simulate(scenario(engine, lora=None))
        def gathered(result):
            return sum(op.nbytes for op in result.schedule.ops() if isinstance(op, Collective)
                       and op.coll.value == "all_gather" and op.purpose != "post-step")
        assert gathered(lora) >= gathered(full) * 0.999
        reduced = sum(op.nbytes for op in lora.schedule.ops() if isinstance(op, Collective)
                      and op.coll.value == "reduce_scatter")
        assert 0 < reduced < 2.1 * 2 * ADAPTERS_7B       # adapters only (16-bit or fp32), padded
        assert reduced * 1000 < sum(op.nbytes for op in full.schedule.ops() if isinstance(op, Collective)
                                    and op.coll.value == "reduce_scatter")


def test_the_memory_table_counts_lora_at_every_stage():
    report = scenario_report(scenario({"zero": {"stage": 2}}))
    rows = {row.stage: row for row in report.rows}
    assert rows[0].params_bytes / GB == pytest.approx(13.5, abs=0.05) and rows[0].optimizer_bytes < 0.1 * GB
    assert rows[3].params_bytes / GB == pytest.approx(13.5 / 4, abs=0.05)


@pytest.mark.parametrize("lora, engine, extra, words", [
    ({"r": 8, "target_modules": ["qq_proj"]}, {"zero": {"stage": 2}}, {}, "matches no Linear"),
    ({"r": 8, "target_modules": ["lm_head"]}, {"zero": {"stage": 2}}, {}, "not simulated yet"),
    ({"r": 8, "target_modules": ["q_proj"], "bias": "all"}, {"zero": {"stage": 2}}, {}, "not simulated yet"),
    ({"r": 8, "target_modules": ["q_proj"], "use_dora": True}, {"zero": {"stage": 2}}, {}, "not simulated yet"),
    ({"r": 0, "target_modules": ["q_proj"]}, {"zero": {"stage": 2}}, {}, "lora.r"),
    ({"r": 8, "target_modules": []}, {"zero": {"stage": 2}}, {}, "lora.target_modules"),
    ({"r": 8, "target_modules": ["q_proj"]}, {"zero": {"stage": 1}}, {"parallel": {"tp": 2}}, "not simulated yet"),
    ({"r": 8, "target_modules": ["q_proj"]}, {"megatron": {}}, {}, "not simulated yet"),
])
def test_lora_input_that_is_not_simulated_or_wrong_is_refused(lora, engine, extra, words):
    with pytest.raises(InputError, match=words):
        scenario_from_table({**table(engine, lora), **extra}, Path("s.toml"), "s")


def test_frozen_linears_keep_no_input_for_a_weight_gradient():
    from sim.analytic.activations import layer_activation_bytes, lora_saved_change
    full, lora = scenario({"zero": {"stage": 2}}, lora=None).model, scenario({"zero": {"stage": 2}}).model
    # q and v targeted: the QKV input stays; o's input (2q), the MLP input (2h) and the product (2I) go;
    # each of the two adapters keeps its rank-8 lora_A output (2r)
    assert lora_saved_change(lora) == 2 * 8 * 2 - 2 * 4096 - 2 * 4096 - 2 * 11008
    tokens = 2048 * 4
    assert layer_activation_bytes(full, 2048, 4) - layer_activation_bytes(lora, 2048, 4) == 38368 * tokens
    every = scenario({"zero": {"stage": 2}}, lora={"r": 8, "target_modules": "all-linear"}).model
    assert lora_saved_change(every) == 2 * 8 * 7     # all kept, seven adapters' outputs added
