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


def planner_for(s: Scenario, layout: Layout, stage: int = 0) -> Planner:
    """The planner that replays the scenario's engine on pipeline stage `stage`."""
    where = s.path or "scenario"
    if s.parallel.pp > 1 and (s.schedule_mode is ScheduleMode.PAPER or s.engine is Engine.FSDP2):
        raise InputError(where, "parallel.pp", "pipeline parallelism is simulated with DeepSpeed ZeRO-0/1 and "
                         "DDP; with FSDP2 and the paper schedules it is not yet; allowed for `zerosim run`: pp = 1")
    if s.parallel.tp > 1 and (s.schedule_mode is ScheduleMode.PAPER or s.engine is Engine.FSDP2):
        raise InputError(where, "parallel.tp", "tensor parallelism is simulated with DeepSpeed and DDP; with "
                         "FSDP2 and the paper schedules it is not yet; allowed for `zerosim run`: tp = 1")
    if s.schedule_mode is ScheduleMode.PAPER:
        return PaperPlanner(s, layout, stage)
    if s.engine is Engine.FSDP2:
        return Fsdp2Planner(s, layout, stage)
    if s.engine in (Engine.DDP, Engine.DDP_ZERO_REDUNDANCY):
        return DdpPlanner(s, layout, stage)
    assert s.zero is not None
    return Zero3Planner(s, layout, stage) if s.zero.stage == 3 else Zero12Planner(s, layout, stage)


def plan(s: Scenario) -> Schedule:
    """The schedule of one optimizer step: one class (pipeline stage) after another."""
    layout = layout_of(s)
    stages = [planner_for(s, layout, k).build() for k in range(layout.pp)]
    return Schedule(stages[0].strategy, [c for st in stages for c in st.classes],
                    list(dict.fromkeys(n for st in stages for n in st.notes)))
