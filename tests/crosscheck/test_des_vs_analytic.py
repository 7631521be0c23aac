"""The DES against its analytic twin (issue: cross-checks)."""

from __future__ import annotations

import pytest

from sim.analytic.comm import zero_volume_paper
from sim.analytic.params import total_params
from sim.core.enums import ZeroStage
from sim.des.engine import Mode
from sim.simulate import simulate, volume_by_kind
from sim.studies.check import check_rows, holds, op_cost, step_bounds
from tests.crosscheck.scenarios import STRATEGIES, tiny


@pytest.mark.parametrize("strategy", [k for k, v in STRATEGIES.items() if v.get("parallel", {}).get("pp", 1) == 1])
@pytest.mark.parametrize("nodes", [1, 2])
def test_serial_step_time_is_the_sum_of_op_costs(strategy, nodes):
    # one rank class (no pipeline): the serial step is exactly the sum of its op costs
    s = tiny(strategy, nodes=nodes)
    r = simulate(s, serial=True)
    total = sum(op_cost(op, s, r.layout) for op in r.schedule.ops(0))
    assert r.step_time_s == pytest.approx(total, rel=1e-9)
    assert r.breakdown.total == pytest.approx(r.step_time_s, rel=1e-9)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("nodes", [1, 2])
def test_des_agrees_with_the_analytic_twin(strategy, nodes):
    r = simulate(tiny(strategy, nodes=nodes))
    for name, des, analytic, relation in check_rows(r):
        assert holds(des, analytic, relation), (name, des, analytic, relation)
    assert r.breakdown.total == pytest.approx(r.step_time_s, rel=1e-9)


@pytest.mark.parametrize("strategy", ["ds-zero2", "ds-zero3", "fsdp2", "ds-zero3-tp2-full-recompute",
                                      "ds-zero1-tp2-pp2"])
def test_full_recompute_volumes(strategy):
    r = simulate(tiny(strategy, recompute="full"))
    for name, des, analytic, relation in check_rows(r):
        assert holds(des, analytic, relation), (name, des, analytic)


@pytest.mark.parametrize(("stage", "factor"), [(0, 2), (1, 2), (2, 2), (3, 3)])
def test_paper_mode_moves_2_psi_or_3_psi(stage, factor):
    s = tiny(f"paper-zero{stage}", grad_accum=1)
    psi, dp = total_params(s.model), s.parallel.dp
    got = sum(volume_by_kind(simulate(s)).values())
    assert got == pytest.approx(factor * psi * 2 * (dp - 1) / dp, rel=1e-12)
    assert got == pytest.approx(zero_volume_paper(psi, dp, ZeroStage(stage)).total, rel=1e-12)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_overlapped_step_lies_between_its_bounds(strategy):
    r = simulate(tiny(strategy, nodes=2))
    b = step_bounds(r)
    assert b.busiest_stream_s * (1 - 1e-9) <= r.step_time_s <= b.serial_s * (1 + 1e-9)


@pytest.mark.parametrize("strategy", ["ddp", "ds-zero1", "ds-zero2-overlap", "ds-zero3", "fsdp2",
                                      "ds-zero3-offload", "paper-zero3", "ds-zero1-tp2-pp2",
                                      "ddp-tp2-sequence-parallel"])
def test_representative_and_full_mode_agree(strategy):
    s = tiny(strategy, nodes=2)
    rep, full = simulate(s), simulate(s, mode=Mode.FULL)
    assert len(full.engine.ranks) == 16 and len(rep.engine.ranks) == s.parallel.pp
    assert full.step_time_s == pytest.approx(rep.step_time_s, rel=1e-9)
    assert full.peak_pool().peak == pytest.approx(rep.peak_pool().peak, rel=1e-9)
    assert volume_by_kind(full) == pytest.approx(volume_by_kind(rep), rel=1e-12)
    for rep_rank in rep.layout.representatives:   # every rank of a class ends with its representative
        ends = [max(sp.end for sp in full.engine.spans if sp.rank == r) for r in range(16)
                if full.layout.class_of(r) == full.layout.class_of(rep_rank)]
        rep_end = max(sp.end for sp in rep.engine.spans if sp.rank == rep_rank)
        assert max(ends) - min(ends) <= 1e-9 * rep.step_time_s
        assert ends[0] == pytest.approx(rep_end, rel=1e-9)
