"""Kernels joined into one compute op (sim.engines.builder `join`, where the planner says no
hook acts) run exactly when they would as one op per module: every kernel starts and ends
at the same time, and the step, the memory timeline and the collectives are the same."""

from __future__ import annotations

from collections import Counter

import pytest

from sim.des.engine import EventEngine, Mode, kernel_time
from sim.engines.plan import layout_of, planner_for
from sim.engines.schedule import Compute, Schedule
from tests.crosscheck.scenarios import STRATEGIES, tiny, without_interference

PIPELINED = {"ds-zero1-pp4": {"zero": {"stage": 1}, "parallel": {"pp": 4}},
             "ds-zero0-tp2": {"zero": {"stage": 0}, "parallel": {"tp": 2}},
             "ds-zero1-overlap-pp2": {"zero": {"stage": 1, "overlap_comm": True}, "parallel": {"pp": 2}}}
CASES = {**STRATEGIES, **PIPELINED}


def schedule(s, *, joins: bool) -> Schedule:
    layout, classes, name = layout_of(s), [], ""
    for stage in range(layout.pp):
        planner = planner_for(s, layout, stage)
        planner.b.joins = joins
        built = planner.build()
        classes += built.classes
        name = built.strategy
    return Schedule(name, classes)


def kernel_times(engine: EventEngine) -> dict[tuple[int, int, str, str], tuple[float, float]]:
    """(rank, micro-step, phase, kernel name, occurrence) -> (start, end) of every compute kernel."""
    out = {}
    seen: Counter[tuple[int, int, str, str]] = Counter()
    for span in engine.spans:
        if isinstance(span.op, Compute):
            t = span.start
            for k in span.op.kernels:
                end = t + kernel_time(k, engine.scenario)
                key = (span.rank, span.op.micro_step, span.op.phase.value, k.name)
                out[(*key, seen[key])] = (t, end)
                seen[key] += 1
                t = end
    return out


def memory(timeline: list[tuple[float, float]], scale: float) -> list[tuple[float, float]]:
    """The memory timeline with changes closer than rounding merged (the last one kept)."""
    out: list[tuple[float, float]] = []
    for t, used in timeline:
        if out and t - out[-1][0] <= 1e-12 * scale:
            out[-1] = (out[-1][0], used)
        else:
            out.append((t, used))
    return out


def runs(s, host: bool) -> tuple[EventEngine, EventEngine]:
    """Plain and joined; without compute-communication interference, which a joined op
    samples once for all its kernels (docs/cost-models.md)."""
    s = without_interference(s)
    out = []
    for joins in (False, True):
        engine = EventEngine(s, schedule(s, joins=joins), layout_of(s), Mode.REPRESENTATIVE, host=host)
        engine.run(1)
        out.append(engine)
    return out[0], out[1]


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_joined_kernels_keep_their_times(name, recompute):
    """Without host costs, kernel by kernel."""
    s = tiny(name, nodes=2, grad_accum=3, recompute=recompute, strategy_table=CASES[name])
    plain, joined = runs(s, host=False)
    scale = plain.step_bounds[-1][1]
    assert joined.step_bounds[-1][1] == pytest.approx(scale, rel=1e-12)
    a, b = kernel_times(plain), kernel_times(joined)
    assert a.keys() == b.keys()
    for key, (start, end) in a.items():
        assert abs(b[key][0] - start) <= 1e-12 * scale and abs(b[key][1] - end) <= 1e-12 * scale, key
    for rank, pool in plain.pools.items():
        assert joined.pools[rank].peak == pytest.approx(pool.peak, rel=1e-12)
        a_mem, b_mem = memory(pool.timeline, scale), memory(joined.pools[rank].timeline, scale)
        assert len(a_mem) == len(b_mem)
        for (t1, used1), (t2, used2) in zip(a_mem, b_mem):
            assert t1 == pytest.approx(t2, rel=1e-12, abs=1e-12 * scale) and used1 == pytest.approx(used2, rel=1e-12)
    comm = lambda e: sorted((sp.rank, sp.op.name, sp.op.micro_step, round(sp.end / scale, 9))   # noqa: E731
                            for sp in e.spans if not isinstance(sp.op, Compute))
    assert comm(plain) == comm(joined)


@pytest.mark.parametrize("name", sorted(CASES))
def test_joined_ops_end_when_their_last_module_would_with_the_host(name):
    """With the host issuing every kernel (a kernel cannot start before its launch, so a
    joined op may stretch), each joined op ends when its last module's op ends unjoined,
    and the step ends at the same time."""
    s = tiny(name, nodes=2, grad_accum=3, recompute="full", strategy_table=CASES[name])
    plain, joined = runs(s, host=True)
    scale = plain.step_bounds[-1][1]
    assert joined.step_bounds[-1][1] == pytest.approx(scale, rel=1e-12)
    ends = {(sp.rank, sp.op.micro_step, sp.op.phase, sp.op.name): sp.end for sp in plain.spans}
    checked = 0
    for sp in joined.spans:
        if isinstance(sp.op, Compute) and sp.op.joined:
            last = ends[(sp.rank, sp.op.micro_step, sp.op.phase, sp.op.joined[-1])]
            assert sp.end == pytest.approx(last, rel=1e-12, abs=1e-12 * scale), sp.op.name
            checked += 1
    assert checked or not any(isinstance(op, Compute) and op.joined for c in joined.schedule.classes
                              for op in c.ops())


def test_the_host_can_hold_a_joined_op_back():
    """Launch costs far above kernel times: the joined op stretches to its last launch."""
    s = tiny("ds-zero1", strategy_table=CASES["ds-zero1"])
    plain, joined = runs(s, host=True)
    assert plain.step_bounds[-1][1] == pytest.approx(joined.step_bounds[-1][1], rel=1e-12)
    assert any(sp.host_inside > 0 or sp.host_wait > 0 for sp in joined.spans)


@pytest.mark.parametrize("name", ["ds-zero1", "ds-zero1-pp4", "ds-zero0-tp2"])
def test_quiet_modules_are_joined(name):
    """Without gradient hooks, a block's forward is one op, not one per module."""
    s = tiny(name, strategy_table=CASES[name])
    plain, joined = schedule(s, joins=False), schedule(s, joins=True)
    count = lambda sch: sum(1 for c in sch.classes for op in c.ops() if isinstance(op, Compute))   # noqa: E731
    assert count(joined) * 2 < count(plain)
    assert any(len(op.kernels) >= 4 for c in joined.classes for op in c.ops() if isinstance(op, Compute))


def test_the_trace_shows_joined_kernels_nested_in_their_op():
    from sim.results.trace import chrome_trace
    from sim.simulate import simulate
    trace = chrome_trace(simulate(tiny("ds-zero1", strategy_table=CASES["ds-zero1"])))["traceEvents"]
    ops = [e for e in trace if e.get("ph") == "X" and e["cat"] == "compute"]
    kernels = [e for e in trace if e.get("ph") == "X" and e["cat"] == "kernel"]
    assert kernels
    for k in kernels:
        parents = [o for o in ops if o["tid"] == k["tid"] and o["ts"] - 1e-6 <= k["ts"]
                   and k["ts"] + k["dur"] <= o["ts"] + o["dur"] + 1e-6]
        assert len(parents) == 1, k["name"]
    for o in ops:
        inside = [k for k in kernels if k["tid"] == o["tid"] and o["ts"] - 1e-6 <= k["ts"] < o["ts"] + o["dur"] - 1e-6]
        if inside:   # back to back, or later where the host launched them later
            assert sum(k["dur"] for k in inside) <= o["dur"] * (1 + 1e-9)
            assert inside[-1]["ts"] + inside[-1]["dur"] == pytest.approx(o["ts"] + o["dur"], rel=1e-9)
