"""simulate(scenario) -> SimulationResult: plan the step, run the DES, collect the numbers
(sim.results.step holds the result and the results contract)."""

from __future__ import annotations

from collections import defaultdict

from sim.analytic.compute import step_flops
from sim.core.perf import paused_gc
from sim.des.engine import EventEngine, Mode
from sim.engines.plan import check_work, layout_of, plan
from sim.inputs.scenario import Scenario
from sim.results.attribution import attribute
from sim.results.step import SimulationResult

__all__ = ["SimulationResult", "simulate", "volume_by_kind"]


def simulate(s: Scenario, *, steps: int = 1, mode: Mode = Mode.REPRESENTATIVE,
             serial: bool = False) -> SimulationResult:
    """Plan and simulate `steps` optimizer steps; report the last one. `serial` runs each
    rank's ops one at a time in issue order (no overlap: the cross-check's identity case)."""
    check_work(s, steps=steps, full=mode is Mode.FULL)
    with paused_gc():
        schedule = plan(s)
    layout = layout_of(s)
    engine = EventEngine(s, schedule, layout, mode, serial)
    engine.run(steps)
    start, end = engine.step_bounds[-1]
    rank = layout.representatives[0]
    spans = [sp for sp in engine.spans if sp.rank == rank and sp.step == steps - 1]
    breakdown = attribute(spans, start, end, serial)
    t = s.training
    checkpoints = t.recompute_plan
    model, hardware = step_flops(s.model, t.seq_len, t.global_batch, recompute=t.recompute,
                                 recomputed_layers=sum(checkpoints.recomputed(n) for n in s.stages.counts())
                                 if checkpoints else None)
    return SimulationResult(s, schedule, layout, engine, mode, steps, end - start, breakdown, model, hardware)


def volume_by_kind(result: SimulationResult) -> dict[str, float]:
    """Bytes one rank sends per step, by collective kind (for the analytic cross-check)."""
    out: dict[str, float] = defaultdict(float)
    for row in result.comm_table():
        out[row["op"]] += row["bytes_per_rank"]
    return dict(out)
