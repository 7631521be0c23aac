"""One model per training engine: everything zerosim knows about an engine, in one record.

An engine model names its planner (the schedule of a step, composed from the skeleton and
the shared policies in sim.engines.policies), the memory it keeps resident on the device and
the host (read by the planner AND by `zerosim memory`), the data-parallel bytes per rank
per step the analytic twin expects of it, and what it cannot do (refused with "not simulated
yet", or because the engine itself refuses it). The keys of its scenario table are read and
range-checked with the other inputs (sim.inputs), below the engines; what they mean lives here.
Adding an engine variant is one module defining a planner and an `EngineModel`, plus its
registration in sim.engines.plan.ENGINES (docs/simulator.md, "Adding an engine").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sim.analytic.placement import TensorGroup
from sim.engines.resident import Resident
from sim.engines.skeleton import Planner
from sim.inputs.scenario import Scenario


def no_limits(s: Scenario) -> None:
    """An engine that can run every scenario the inputs accept."""


@dataclass(frozen=True, slots=True)
class EngineModel:
    name: str
    summary: str                                               # one line, for docs and notes
    applies: Callable[[Scenario], bool]                        # is this the scenario's engine?
    planner: type[Planner]
    resident: Callable[[Scenario, list[TensorGroup]], Resident]
    volume: Callable[[Scenario], dict[str, float]]             # data-parallel bytes / rank / step
    check: Callable[[Scenario], None] = no_limits              # raise InputError for what it cannot do
