"""FSDP2 with pipeline stages, as torch.distributed.pipelining runs it under torchtitan:
units gathered once per step and kept, gradients accumulated unsharded and reduced after
the stage's last micro-batch (REDUCE_GRAD), the memory that costs, and what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.core.errors import InputError
from sim.engines.schedule import Collective, Compute, Mem
from sim.inputs.load import scenario_from_table
from sim.results.memory_report import scenario_report
from sim.simulate import simulate
from tests.crosscheck.scenarios import TINY_MODEL, tiny

ACCUM = 4


def collectives(r, stage: int, coll: str) -> list:
    return [op for op in r.schedule.ops(stage) if isinstance(op, Collective) and op.coll.value == coll]


@pytest.fixture(scope="module")
def run():
    return simulate(tiny("fsdp2-pp2", grad_accum=ACCUM))


def test_each_stage_gathers_its_units_once_and_reduces_them_after_its_last_micro_batch(run):
    for stage, units in ((0, {"root", "block 0", "block 1"}), (1, {"block 2", "block 3", "root"})):
        gathers, scatters = collectives(run, stage, "all_gather"), collectives(run, stage, "reduce_scatter")
        assert sorted(op.name.removeprefix("all-gather ") for op in gathers) == sorted(units)
        assert {op.micro_step for op in gathers} == {0}
        assert [op.name.removeprefix("reduce-scatter ") for op in scatters] == ["root", *sorted(units - {"root"})]
        assert {op.micro_step for op in scatters} == {ACCUM - 1}
    # the pipeline sends between the stages, every micro-batch both ways
    sends = [op for op in run.schedule.ops(0) if op.name.startswith("send")]
    assert len(sends) == ACCUM


def test_gradients_accumulate_unsharded_in_the_reduce_dtype(run):
    grads = [a for op in run.schedule.ops(0) if isinstance(op, Compute) for a in op.alloc
             if a.label.startswith("accumulated unsharded gradients")]
    assert len(grads) == 3            # root (embedding) and two blocks, once each
    peak = run.peak_pool().peak_breakdown
    assert peak.get(Mem.GRADS, 0.0) >= sum(a.nbytes for a in grads)


@pytest.mark.parametrize("strategy", ["fsdp2-pp2", "fsdp2-tp2-pp2-hsdp", "fsdp2-no-reshard", "fsdp2"])
def test_the_memory_report_bounds_the_simulated_peak(strategy):
    s = tiny(strategy, grad_accum=ACCUM)
    report = scenario_report(s).rows[scenario_report(s).this_stage]
    assert report.total_bytes >= simulate(s).peak_pool().peak


def test_it_costs_a_pipeline_bubble_and_keeps_the_stage_gathered(run):
    flat = simulate(tiny("fsdp2-no-reshard", grad_accum=ACCUM))
    assert run.breakdown.bubble_s > 0 and flat.breakdown.bubble_s == 0


def table(**fsdp) -> dict:
    return {"model": TINY_MODEL, "cluster": "dgx-a100-80g", "nodes": 1, "fsdp": fsdp, "parallel": {"pp": 2},
            "training": {"seq_len": 512, "micro_batch": 2, "grad_accum": 4, "precision": "bf16"}}


@pytest.mark.parametrize(("fsdp", "key"), [({}, "fsdp.reshard_after_forward"),
                                           ({"reshard_after_forward": 2}, "fsdp.reshard_after_forward"),
                                           ({"reshard_after_forward": False, "cpu_offload": True}, "fsdp.cpu_offload"),
                                           ({"reshard_after_forward": False, "reshard_root": True}, "fsdp.reshard_root")])
def test_what_torchtitan_does_not_run_is_refused(fsdp, key):
    s = scenario_from_table(table(**fsdp), Path("s.toml"), "s")
    with pytest.raises(InputError) as err:
        simulate(s)
    assert key in str(err.value) and "not simulated yet" in str(err.value)
