"""The engine's compute-communication interference (sim.des.interference) on whole schedules:
compute is late by exactly c / (1 + c) of the time communication of its rank overlapped it,
and the result does not depend on whether a collective is timed in closed form or on the
flow network (the former start-of-op rule did: it asked which of two events at the same
instant SimPy ran first)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.des.engine import EventEngine, Mode
from sim.engines.plan import layout_of, plan
from sim.engines.schedule import Collective, Compute, GpuOptimizer, Send
from tests.crosscheck.scenarios import tiny, without_host

C = 0.3
CASES = [("fsdp2", 1), ("ds-zero3-prefetch", 2), ("ds-zero2-overlap", 2), ("ddp", 2), ("megatron-distopt-tp2-pp2", 2)]


def with_interference(s, c: float):
    gpu = replace(s.cluster.gpu, comm_interference=c)
    return replace(s, cluster=replace(s.cluster, node=replace(s.cluster.node, gpu=gpu)))


def run(s, *, shortcuts: bool = True) -> EventEngine:
    engine = EventEngine(s, plan(s), layout_of(s), Mode.REPRESENTATIVE, shortcuts=shortcuts)
    engine.run(1)
    return engine


def union_overlap(a: float, b: float, intervals: list[tuple[float, float]]) -> float:
    total, reach = 0.0, a
    for s, e in sorted((max(s, a), min(e, b)) for s, e in intervals if s < b and e > a):
        if e > reach:
            total += e - max(s, reach)
            reach = e
    return total


@pytest.mark.parametrize(("strategy", "nodes"), CASES)
def test_compute_is_late_by_the_shared_part_of_its_overlap(strategy, nodes):
    """Summed over the compute stream. A run of joined ops is made late as a whole, at its
    last op; when that op is a collective of the compute stream itself (a ZeRO-3 fetch or a
    TP all-reduce joined to the compute), only its time after its own counts."""
    s = without_host(tiny(strategy, nodes=nodes))
    on_compute = lambda sp: sp.op.stream.value == "compute"   # noqa: E731
    alone = {(sp.rank, sp.op.id): sp.end - sp.start for sp in run(s).spans if on_compute(sp)}
    engine = run(with_interference(s, C))
    rank = engine.layout.representatives[0]
    spans = [sp for sp in engine.spans if sp.rank == rank]
    comm = [(sp.start, sp.end) for sp in spans if isinstance(sp.op, (Collective, Send)) and not on_compute(sp)]
    k = engine.layout.class_of(rank)
    timed = engine._exclusive_times(k, engine.schedule.classes[k])   # the rest run on the flow network,
    kernels = (Compute, GpuOptimizer)                                # whose sharing moves them too
    compute = [sp for sp in spans if on_compute(sp) and (isinstance(sp.op, kernels) or sp.op.id in timed)]
    late = sum(sp.end - sp.start - alone[(rank, sp.op.id)] for sp in compute)
    overlap = sum(union_overlap(sp.start if isinstance(sp.op, kernels) else sp.start + alone[(rank, sp.op.id)],
                                sp.end, comm) for sp in compute)
    assert overlap > 0, "the case must overlap compute with communication"
    assert late == pytest.approx(overlap * C / (1 + C), rel=1e-6, abs=len(compute) * 1e-9)


@pytest.mark.parametrize(("strategy", "nodes"), CASES)
def test_closed_form_and_flow_network_collectives_interfere_alike(strategy, nodes):
    s = with_interference(tiny(strategy, nodes=nodes), C)
    fast, plain = run(s, shortcuts=True), run(s, shortcuts=False)
    assert fast.step_bounds[-1][1] == pytest.approx(plain.step_bounds[-1][1], rel=1e-9)


def test_interference_lengthens_the_step_and_none_leaves_it_alone():
    s = without_host(tiny("fsdp2", nodes=1))
    base = run(with_interference(s, 0.0)).step_bounds[-1][1]
    slowed = run(with_interference(s, C)).step_bounds[-1][1]
    assert base < slowed < base * (1 + C)
