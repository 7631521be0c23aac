"""The engine's shortcuts change its speed, never its answers: fused op chains (ops that
follow their predecessor run in its SimPy step) and closed-form times for collectives whose
links are always their own (sim.des.transfers) give every op the same start and end as the
plain run, op by op, memory peaks included."""

from __future__ import annotations

import pytest

from sim.des.class_plan import implied_deps
from sim.des.engine import EventEngine, Mode
from sim.engines.plan import layout_of, plan
from sim.engines.schedule import ClassSchedule, Collective, Send
from tests.crosscheck.scenarios import STRATEGIES, tiny, without_interference

CASES = [(name, 1) for name in STRATEGIES] + [(name, 2) for name in
                                              ("ddp", "ds-zero2-overlap", "ds-zero3-prefetch", "fsdp2",
                                               "ds-zero1-tp2-pp2", "ddp-tp2-sequence-parallel",
                                               "ds-zero3-tp2-full-recompute")]


def run(s, *, shortcuts: bool, mode: Mode = Mode.REPRESENTATIVE) -> EventEngine:
    s = without_interference(s)
    engine = EventEngine(s, plan(s), layout_of(s), mode, shortcuts=shortcuts)
    engine.run(2)
    return engine


@pytest.mark.parametrize(("strategy", "nodes"), CASES)
def test_shortcuts_give_every_op_the_same_times(strategy, nodes):
    s = tiny(strategy, nodes=nodes, recompute="full" if "recompute" in strategy else "none")
    fast, plain = run(s, shortcuts=True), run(s, shortcuts=False)
    flat = lambda bounds: [t for pair in bounds for t in pair]   # noqa: E731
    assert flat(fast.step_bounds) == pytest.approx(flat(plain.step_bounds), rel=1e-12)
    key = lambda sp: (sp.rank, sp.op.id)   # noqa: E731
    fast_spans, plain_spans = sorted(fast.spans, key=key), sorted(plain.spans, key=key)
    assert [key(sp) for sp in fast_spans] == [key(sp) for sp in plain_spans]
    scale = plain.step_bounds[-1][1]
    for a, b in zip(fast_spans, plain_spans):
        assert abs(a.start - b.start) <= 1e-12 * scale and abs(a.end - b.end) <= 1e-12 * scale, a.op.name
    for rank, pool in plain.pools.items():
        assert fast.pools[rank].peak == pytest.approx(pool.peak, rel=1e-12)


def test_tensor_parallel_all_reduces_take_the_closed_form_in_representative_mode():
    """tp 2 on one node: the TP all-reduces are the only users of the NVLink port, all on the
    compute stream, so the engine gives them their closed-form time and fuses them into the
    compute chain; data-parallel reductions on the reduce stream share the NIC and are not."""
    s = tiny("ds-zero1-tp2-pp2", nodes=2)
    engine = EventEngine(s, plan(s), layout_of(s), Mode.REPRESENTATIVE)
    cls = engine.schedule.classes[0]
    times = engine._exclusive_times(0, cls)
    tp_ops = [op for op in cls.ops() if getattr(op, "purpose", "") == "tensor parallel"]
    assert tp_ops and all(op.id in times for op in tp_ops)
    sends = [op for op in cls.ops() if isinstance(op, Send)]
    assert sends and not any(op.id in times for op in sends)
    gathers = [op for op in cls.ops() if isinstance(op, Collective) and op.purpose == "pipeline"]
    assert gathers and all(op.id in times for op in gathers)    # DeepSpeed's partitions, over NVLink


def reference_implied(cls: ClassSchedule) -> dict[int, bool]:
    """implied_deps written plainly: a full per-stream knowledge list per op."""
    streams = list(cls.streams)
    where = {op.id: (streams.index(st), i) for st, ops in cls.streams.items() for i, op in enumerate(ops)}
    prev = {op.id: (ops[i - 1].id if i else None) for ops in cls.streams.values() for i, op in enumerate(ops)}
    known: dict[int, list[int]] = {}
    out = {}
    for op in sorted(cls.ops(), key=lambda o: o.id):
        done = list(known[prev[op.id]]) if prev[op.id] is not None else [-1] * len(streams)
        implied = True
        for dep in op.deps:
            stream, pos = where[dep]
            if done[stream] >= pos:
                continue
            implied = False
            done = [max(a, b) for a, b in zip(done, known[dep])]
        stream, pos = where[op.id]
        done[stream] = pos
        known[op.id], out[op.id] = done, implied
    return out


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_implied_dependencies_match_the_plain_definition(strategy):
    s = tiny(strategy, nodes=2, grad_accum=3)
    for cls in plan(s).classes:
        assert implied_deps(cls) == reference_implied(cls)


def test_a_schedule_simulated_again_gives_the_same_times_and_reuses_what_its_ops_imply():
    """The engine keeps what depends on the ops alone (`ClassSchedule.derived`), so a second
    simulation of one planned schedule (a fit's next evaluation) reuses it and answers the
    same; appending an op changes the streams' shape and the kept facts are derived anew."""
    s = without_interference(tiny("fsdp2", nodes=2, grad_accum=2))
    schedule = plan(s)
    first = EventEngine(s, schedule, layout_of(s), Mode.REPRESENTATIVE)
    first.run(1)
    kept = {name: value for name, (_, value) in schedule.classes[0].derived.items()}
    assert set(kept) == {"implied", "awaited"}
    again = EventEngine(s, schedule, layout_of(s), Mode.REPRESENTATIVE)
    again.run(1)
    assert again.step_bounds == first.step_bounds
    assert all(schedule.classes[0].derived[name][1] is value for name, value in kept.items())
    cls = schedule.classes[0]
    stream, ops = next((stream, ops) for stream, ops in cls.streams.items() if ops)
    shape = cls.shape()
    ops.append(ops[-1])
    assert cls.shape() != shape
    ops.pop()
    assert cls.shape() == shape
