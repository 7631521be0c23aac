"""The engine models, and what every layer asks of the scenario's engine: its schedule,
its resident memory, its expected volume, and whether it can run the scenario at all.

`model_of(s)` is the one dispatch: it finds the engine model that applies and runs its
checks, so `zerosim run`, `memory` and `check` refuse the same scenarios with the same
message. The table below is the whole registry, in plain sight.
"""

from __future__ import annotations

from sim.analytic.placement import stage_census
from sim.core.errors import InputError
from sim.core.limits import estimated_ops
from sim.engines.ddp import DDP
from sim.engines.deepspeed_zero3 import DEEPSPEED_ZERO3
from sim.engines.deepspeed_zero3_v05 import DEEPSPEED_ZERO3_V05
from sim.engines.deepspeed_zero12 import DEEPSPEED_ZERO012
from sim.engines.fsdp2 import FSDP2
from sim.engines.layout import Layout
from sim.engines.megatron import MEGATRON
from sim.engines.model import EngineModel
from sim.engines.paper import PAPER
from sim.engines.resident import Resident
from sim.engines.schedule import Schedule
from sim.engines.skeleton import Planner
from sim.engines.workload import unit_count
from sim.inputs.scenario import Scenario

ENGINES: tuple[EngineModel, ...] = (PAPER, DDP, FSDP2, DEEPSPEED_ZERO012, DEEPSPEED_ZERO3, DEEPSPEED_ZERO3_V05,
                                    MEGATRON)


def model_of(s: Scenario) -> EngineModel:
    """The scenario's engine model, after its checks (InputError for what it cannot do)."""
    found = [m for m in ENGINES if m.applies(s)]
    assert len(found) == 1, (s.name, [m.name for m in found])
    found[0].check(s)
    return found[0]


def layout_of(s: Scenario) -> Layout:
    p, f = s.parallel, s.fsdp
    if f is None:
        return Layout(tp=p.tp, pp=p.pp, dp=p.dp, gpus_per_node=s.gpus_per_node)
    return Layout(tp=p.tp, pp=p.pp, dp=p.dp, gpus_per_node=s.gpus_per_node, shard=p.dp // f.replicate_degree,
                  post=f.post_forward)


def planner_for(s: Scenario, layout: Layout, stage: int = 0) -> Planner:
    """The planner of pipeline stage `stage`."""
    return model_of(s).planner(s, layout, stage)


def plan(s: Scenario) -> Schedule:
    """The schedule of one optimizer step: one class (pipeline stage) after another."""
    layout = layout_of(s)
    stages = [planner_for(s, layout, k).build() for k in range(layout.pp)]
    return Schedule(stages[0].strategy, [c for st in stages for c in st.classes],
                    list(dict.fromkeys(n for st in stages for n in st.notes)))


def resident_memory(s: Scenario, stage: int = 0) -> Resident:
    """What one rank of pipeline stage `stage` keeps resident, device and host (the same
    allocations the planner starts the DES from)."""
    return model_of(s).resident(s, stage_census(s.model, s.parallel.tp, s.stages, stage))


def expected_dp_volume(s: Scenario) -> dict[str, float]:
    """Data-parallel bytes per rank per step the analytic twin expects of the engine."""
    return model_of(s).volume(s)


def check_work(s: Scenario, *, steps: int, full: bool) -> None:
    """Refuse, before planning, a scenario whose schedule or simulation would exceed the
    engine's limits (sim.core.limits); `full` simulates every rank, else one per pipeline stage."""
    per_module = model_of(s).planner.per_module
    units = unit_count(s.model, per_module=per_module)
    ranks = s.world_size // s.parallel.pp if full else 1
    work = estimated_ops(units, per_module, s.training.grad_accum, ranks, steps)
    problem = work.problem()
    if problem:
        raise InputError(s.path or "scenario", "(engine work)",
                         f"{units:,} units x {s.training.grad_accum:,} micro-steps x {ranks:,} simulated "
                         f"ranks per stage x {steps} steps: {problem}")
