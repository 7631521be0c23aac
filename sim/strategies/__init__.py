"""Schedule planners, one per engine and ZeRO stage: a dict in plain sight, no registry."""

from __future__ import annotations

from sim.errors import InputError
from sim.layout import Layout
from sim.scenario import Engine, Scenario, ScheduleMode
from sim.schedule import Schedule
from sim.strategies.common import Planner
from sim.strategies.ddp import DdpPlanner
from sim.strategies.fsdp2 import Fsdp2Planner
from sim.strategies.paper import PaperPlanner
from sim.strategies.zero3 import Zero3Planner
from sim.strategies.zero12 import Zero12Planner


def layout_of(s: Scenario) -> Layout:
    p = s.parallel
    return Layout(tp=p.tp, pp=p.pp, dp=p.dp, gpus_per_node=s.gpus_per_node)


def planner_for(s: Scenario, layout: Layout) -> Planner:
    """The planner that replays the scenario's engine."""
    if s.parallel.tp > 1 or s.parallel.pp > 1:
        raise InputError(s.path or "scenario", "parallel", "tensor- and pipeline-parallel schedules are "
                         "not simulated yet (zerosim memory covers them); allowed for `zerosim run`: tp = 1, pp = 1")
    if s.schedule_mode is ScheduleMode.PAPER:
        return PaperPlanner(s, layout)
    if s.engine is Engine.FSDP2:
        return Fsdp2Planner(s, layout)
    if s.engine in (Engine.DDP, Engine.DDP_ZERO_REDUNDANCY):
        return DdpPlanner(s, layout)
    assert s.zero is not None
    return Zero3Planner(s, layout) if s.zero.stage == 3 else Zero12Planner(s, layout)


def plan(s: Scenario) -> Schedule:
    """The per-rank-class schedule of one optimizer step."""
    layout = layout_of(s)
    return planner_for(s, layout).build()
