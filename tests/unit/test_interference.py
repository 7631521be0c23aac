"""Compute-communication interference as processor sharing (sim.des.interference): compute
loses c / (1 + c) of the time a collective overlaps it, whichever began first, and never
ends late because a wait was too long."""

from __future__ import annotations

import pytest

from sim.des.interference import Interference

C = 0.25


def run(model: Interference, start: float, work: float, rank: int = 0) -> float:
    """What the engine does: wait out the work alone, then make up the shortfall."""
    now = start + work
    left = model.shortfall(rank, start, now, work)
    while left:
        now += model.step(rank, now, left)
        left = model.shortfall(rank, start, now, work)
    return now


def test_overlap_is_the_union_of_intervals_and_open_ones():
    m = Interference([0], C)
    m.timed(0, 1.0, 3.0)
    m.timed(0, 2.0, 4.0)          # overlaps the first: counted once
    m.timed(0, 6.0, 7.0)
    m.opened(0, 8.0, 8.5)         # in flight: up to the window's end
    assert m.overlapped(0, 0.0, 10.0) == pytest.approx(3.0 + 1.0 + 2.0)
    assert m.overlapped(0, 2.5, 6.5) == pytest.approx(1.5 + 0.5)
    assert m.overlapped(0, 4.0, 6.0) == 0.0


def test_a_collective_from_the_start_slows_the_overlapped_part_only():
    """Op of 10 ms beside a collective of 4 ms from its start: 4 ms at 1 / (1 + c), the rest
    at the full rate, so it ends 4 c / (1 + c) ms late."""
    m = Interference([0], C)
    m.timed(0, 0.0, 4e-3)
    assert run(m, 0.0, 10e-3) == pytest.approx(10e-3 + 4e-3 * C / (1 + C), rel=1e-9)


def test_a_collective_longer_than_the_op_slows_all_of_it():
    m = Interference([0], C)
    m.timed(0, 0.0, 1.0)
    assert run(m, 0.0, 10e-3) == pytest.approx(10e-3 * (1 + C), rel=1e-9)


def test_a_collective_that_begins_during_the_op_slows_it_too():
    """The former rule judged overlap at the op's start and missed this one."""
    m = Interference([0], C)
    m.timed(0, 6e-3, 8e-3)
    assert run(m, 0.0, 10e-3) == pytest.approx(10e-3 + 2e-3 * C / (1 + C), rel=1e-9)


def test_no_collective_no_slowdown_and_other_ranks_do_not_count():
    m = Interference([0, 1], C)
    m.timed(1, 0.0, 1.0)
    assert run(m, 0.0, 10e-3, rank=0) == 10e-3


def test_a_flow_network_collective_is_waited_out_without_overshooting():
    """Open with an earliest end of 3 ms that it outlives (closed at 5 ms): each wait stops
    where the op could end at the earliest, so the op ends exactly where the rates put it."""
    m = Interference([0], C)
    token = m.opened(0, 0.0, 3e-3)
    now, left = 2e-3, m.shortfall(0, 0.0, 2e-3, 2e-3)
    assert left == pytest.approx(2e-3 * C / (1 + C))
    wait = m.step(0, now, left)
    assert now + wait <= 3e-3 + 1e-15              # at the shared rate up to the known end
    now += wait
    m.closed(0, token, 5e-3)                       # it ran on; the engine asks again
    while left := m.shortfall(0, 0.0, now, 2e-3):
        now += m.step(0, now, left)
    assert now == pytest.approx(2e-3 * (1 + C), rel=1e-9)   # overlapped all along: all of it slowed


def test_own_collectives_of_a_joined_run_are_neither_work_nor_beside_it():
    """A run of compute (5 ms) and its stream's own TP all-reduce (1 ms), nothing beside it:
    not slowed."""
    m = Interference([0], C)
    m.timed(0, 5e-3, 6e-3)
    assert m.shortfall(0, 0.0, 6e-3, 5e-3, idle=[(5e-3, 6e-3)]) == 0.0
    m.timed(0, 4e-3, 6e-3)                         # a collective beside the last ms of compute
    assert m.shortfall(0, 0.0, 6e-3, 5e-3, idle=[(5e-3, 6e-3)]) == pytest.approx(1e-3 * C / (1 + C))
