"""Schedule planners, one per engine and ZeRO stage: a dict in plain sight, no registry."""

from __future__ import annotations

from sim.core.enums import Engine, ScheduleMode
from sim.core.errors import InputError
from sim.core.limits import estimated_ops
from sim.engines.ddp import DdpPlanner
from sim.engines.deepspeed_zero3 import Zero3Planner
from sim.engines.deepspeed_zero12 import Zero12Planner
from sim.engines.fsdp2 import Fsdp2Planner
from sim.engines.layout import Layout
from sim.engines.paper import PaperPlanner
from sim.engines.schedule import Schedule
from sim.engines.skeleton import Planner
from sim.engines.workload import unit_count
from sim.inputs.scenario import Scenario


def layout_of(s: Scenario) -> Layout:
    p = s.parallel
    return Layout(tp=p.tp, pp=p.pp, dp=p.dp, gpus_per_node=s.gpus_per_node)


def planner_class(s: Scenario) -> type[Planner]:
    """The planner that replays the scenario's engine (combinations not simulated yet were
    refused when the scenario was loaded, sim.inputs.scenario_checks)."""
    if s.schedule_mode is ScheduleMode.PAPER:
        return PaperPlanner
    if s.engine is Engine.FSDP2:
        return Fsdp2Planner
    if s.engine in (Engine.DDP, Engine.DDP_ZERO_REDUNDANCY):
        return DdpPlanner
    assert s.zero is not None
    return Zero3Planner if s.zero.stage == 3 else Zero12Planner


def planner_for(s: Scenario, layout: Layout, stage: int = 0) -> Planner:
    """The planner of pipeline stage `stage`."""
    return planner_class(s)(s, layout, stage)


def check_work(s: Scenario, *, steps: int, full: bool) -> None:
    """Refuse, before planning, a scenario whose schedule or simulation would exceed the
    engine's limits (sim.core.limits); `full` simulates every rank, else one per pipeline stage."""
    per_module = planner_class(s).per_module
    units = unit_count(s.model, per_module=per_module)
    ranks = s.world_size // s.parallel.pp if full else 1
    work = estimated_ops(units, per_module, s.training.grad_accum, ranks, steps)
    problem = work.problem()
    if problem:
        raise InputError(s.path or "scenario", "(engine work)",
                         f"{units:,} units x {s.training.grad_accum:,} micro-steps x {ranks:,} simulated "
                         f"ranks per stage x {steps} steps: {problem}")


def plan(s: Scenario) -> Schedule:
    """The schedule of one optimizer step: one class (pipeline stage) after another."""
    layout = layout_of(s)
    stages = [planner_for(s, layout, k).build() for k in range(layout.pp)]
    return Schedule(stages[0].strategy, [c for st in stages for c in st.classes],
                    list(dict.fromkeys(n for st in stages for n in st.notes)))
