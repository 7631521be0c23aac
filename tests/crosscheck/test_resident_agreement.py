"""`zerosim memory` and `zerosim run` read each engine's resident memory from one source
(sim.engines.resident): their numbers agree for every engine, and the closed forms behind it agree
with the planners' own tensor-by-tensor sums."""

from __future__ import annotations

import pytest

from sim.analytic.placement import stage_census
from sim.engines.ddp import greedy_loads, greedy_partition
from sim.engines.plan import layout_of, plan, planner_for
from sim.engines.schedule import Mem
from sim.engines.zero3_memory import persistent_numel
from sim.results.memory_report import scenario_report
from tests.crosscheck.scenarios import STRATEGIES, tiny

EXTRA = {   # variants the cross-check list does not have
    "fsdp2-cpu-offload": {"fsdp": {"cpu_offload": True}},
    "ds-zero1-offload": {"zero": {"stage": 1, "offload_optimizer": "cpu"}},
    "ddp-zero-redundancy-pp2": {"engine": "ddp-zero-redundancy", "parallel": {"pp": 2}},
}
ALL = {**STRATEGIES, **EXTRA}


def des_resident(schedule, stage: int) -> dict[str, float]:
    out = {m.value: 0.0 for m in (Mem.PARAMS, Mem.GRADS, Mem.OPTIMIZER, Mem.BUFFERS)}
    for alloc in schedule.classes[stage].resident:
        out[alloc.category.value] += alloc.nbytes
    out["host"] = sum(a.nbytes for a in schedule.classes[stage].host)
    return out


@pytest.mark.parametrize("strategy", sorted(ALL))
def test_memory_and_run_start_from_the_same_resident_bytes(strategy):
    s = tiny(strategy, strategy_table=ALL[strategy])
    report = scenario_report(s)
    assert report.resident is not None
    assert report.resident == des_resident(plan(s), report.pipeline_stage)
    own = report.rows[report.this_stage]
    for column in ("params", "grads", "optimizer"):   # the row adds transients, never less
        assert getattr(own, f"{column}_bytes") >= report.resident[column]
    assert own.host_bytes == report.resident["host"]


def test_ddp_buffers_are_a_full_fp32_gradient_copy_in_both():
    """The drift the issue found: DDP buckets were 4 B/param in the DES and 2 in `memory`."""
    s = tiny("ddp")
    psi = sum(g.numel * g.count for g in stage_census(s.model, 1, 1, 0))
    report = scenario_report(s)
    assert report.resident["buffers"] == pytest.approx(4 * psi + 4 * s.model.head_dim // 2 * 2)
    assert report.rows[0].buffers_bytes == report.resident["buffers"]


@pytest.mark.parametrize("strategy", ["ds-zero3", "ds-zero3-tp2-full-recompute"])
@pytest.mark.parametrize("cap", [None, 20_000])
def test_persistent_parameters_closed_form_matches_the_planner(strategy, cap):
    extra = {"stage3_model_persistence_threshold": cap} if cap else None
    s = tiny(strategy, extra_zero=extra)
    planner = planner_for(s, layout_of(s))
    census = stage_census(s.model, s.parallel.tp, s.parallel.pp, 0)
    assert persistent_numel(s, census) == planner.persistent_numel


@pytest.mark.parametrize("ranks", [1, 2, 3, 8, 64])
def test_greedy_loads_match_the_greedy_partition(ranks):
    s = tiny("ddp-zero-redundancy")
    census = stage_census(s.model, 1, 1, 0)
    numels = [g.numel for g in census for _ in range(g.count)]
    owned = greedy_partition(numels, ranks)
    assert greedy_loads(census, ranks) == [sum(numels[i] for i in own) for own in owned]
