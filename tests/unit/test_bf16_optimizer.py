"""DeepSpeed's BF16_Optimizer (deepspeed/runtime/bf16_optimizer.py), which DeepSpeed runs for
bf16 with ZeRO-1 and fp32 gradient accumulation, or bf16 without ZeRO under a pipeline: its
full-size accumulation buffer in memory, one all-reduce per step in the buffer's dtype, a
memory-bound accumulation after every micro-step, and the combinations DeepSpeed refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.analytic.params import total_params
from sim.core.errors import InputError
from sim.engines.schedule import Collective, Compute
from sim.inputs.load import scenario_from_table
from sim.results.memory_report import scenario_report
from sim.simulate import simulate
from tests.crosscheck.scenarios import TINY_MODEL, tiny

ACCUM = 4


def grad_all_reduce_bytes(r) -> float:
    return sum(op.nbytes for op in r.schedule.ops(0) if isinstance(op, Collective) and op.name == "bucket all-reduce")


def test_fp32_accumulation_all_reduces_4_bytes_a_parameter_once_per_step_and_accumulates_every_micro_step():
    zero1 = simulate(tiny("ds-zero1", grad_accum=ACCUM))
    bf16 = simulate(tiny("ds-zero1-bf16-optimizer", grad_accum=ACCUM))
    psi = total_params(bf16.scenario.model)
    assert grad_all_reduce_bytes(bf16) == pytest.approx(4 * psi) and grad_all_reduce_bytes(zero1) == pytest.approx(2 * psi)
    reductions = [op for op in bf16.schedule.ops(0) if isinstance(op, Collective) and op.name == "bucket all-reduce"]
    assert {op.micro_step for op in reductions} == {ACCUM - 1}
    accumulations = [op for op in bf16.schedule.ops(0) if isinstance(op, Compute) and "update_hp_grads" in op.name]
    assert sorted(op.micro_step for op in accumulations) == list(range(ACCUM))
    assert accumulations[0].kernels[0].bytes == pytest.approx(psi * (2 * 2 + 2 * 4))


def test_its_buffer_costs_4_bytes_a_parameter_more_than_zero1_holds():
    """ZeRO-1 holds 16-bit parameters and gradients and 12 B / dp of fp32 state, and builds its
    4 B / dp fp32 gradient partition only for the step; BF16_Optimizer adds the full-size
    fp32 buffer to the same and has no IPG bucket."""
    zero1, bf16 = tiny("ds-zero1", extra_zero={"reduce_bucket_size": 1000}), tiny("ds-zero1-bf16-optimizer")
    psi = total_params(bf16.model)
    own = {name: scenario_report(s).resident for name, s in (("zero1", zero1), ("bf16", bf16))}
    assert own["bf16"]["grads"] - own["zero1"]["grads"] == pytest.approx(4 * psi, rel=1e-3)
    assert own["bf16"]["optimizer"] == own["zero1"]["optimizer"]
    report = scenario_report(bf16)
    assert report.rows[report.this_stage].optimizer_bytes == own["bf16"]["optimizer"]   # no fp32 partition copy
    assert simulate(bf16).peak_pool().peak > simulate(zero1).peak_pool().peak + 3 * psi


def test_without_zero_a_bf16_pipeline_runs_it_with_bf16_accumulation():
    s = tiny("ds-zero0-pp2-bf16-optimizer", grad_accum=ACCUM)
    assert s.bf16_optimizer_bytes == 2 and tiny("ds-zero0").bf16_optimizer_bytes == 0
    r = simulate(s)
    assert any(op.name.startswith("all_gather_into_tensor") for op in r.schedule.ops(0))   # partitioned like ZeRO-1


def table(zero: dict, precision: str = "bf16", pp: int = 1) -> dict:
    return {"model": TINY_MODEL, "cluster": "dgx-a100-80g", "nodes": 1, "zero": zero, "parallel": {"pp": pp},
            "training": {"seq_len": 512, "micro_batch": 2, "grad_accum": 4, "precision": precision}}


@pytest.mark.parametrize(("zero", "precision", "words"), [
    ({"stage": 2, "grad_accum_dtype": "fp32"}, "bf16", "not simulated yet"),
    ({"stage": 1, "grad_accum_dtype": "fp32", "offload_optimizer": "cpu"}, "bf16", "not simulated yet"),
    ({"stage": 0, "grad_accum_dtype": "fp32"}, "bf16", "unsupported mix"),
    ({"stage": 1, "grad_accum_dtype": "fp32"}, "fp16", "not simulated yet"),
    ({"stage": 1, "grad_accum_dtype": "int8"}, "bf16", "fp32, bf16, fp16")])
def test_what_deepspeed_does_not_run_this_way_is_refused(zero, precision, words):
    with pytest.raises(InputError) as err:
        simulate(scenario_from_table(table(zero, precision), Path("s.toml"), "s"))
    assert "zero.grad_accum_dtype" in str(err.value) and words in str(err.value)


def test_the_model_dtype_changes_nothing():
    same = scenario_from_table(table({"stage": 1, "grad_accum_dtype": "bf16"}), Path("s.toml"), "s")
    plain = scenario_from_table(table({"stage": 1}), Path("s.toml"), "s")
    assert same.bf16_optimizer_bytes == 0 and simulate(same).step_time_s == simulate(plain).step_time_s


def test_a_deepspeed_config_selects_it_through_data_types(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"bf16": {"enabled": True}, "zero_optimization": {"stage": 1},
                              "data_types": {"grad_accum_dtype": "fp32"}, "train_micro_batch_size_per_gpu": 2,
                              "gradient_accumulation_steps": 4}))
    s = scenario_from_table({"model": TINY_MODEL, "cluster": "dgx-a100-80g", "nodes": 1, "deepspeed": str(ds),
                             "training": {"seq_len": 512}}, tmp_path / "s.toml", "s")
    assert s.bf16_optimizer_bytes == 4
