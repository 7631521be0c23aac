"""The uses of compute granules that make up a micro-step's trace (sim.engines.skeleton)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class UseKind(StrEnum):
    FORWARD = "F"
    RECOMPUTE = "R"        # the forward run again in backward (full recomputation)
    BACKWARD = "B"
    CONTAINER = "C"        # entering a module with children (DeepSpeed ZeRO-3 hooks it too)


F, R, B, C = UseKind.FORWARD, UseKind.RECOMPUTE, UseKind.BACKWARD, UseKind.CONTAINER


@dataclass(frozen=True, slots=True)
class Use:
    """One use of a granule in the trace of a micro-step."""

    what: UseKind
    index: int           # granule index (-1 for a container)
    micro_step: int
