"""Policies the engine planners are composed of, instead of each engine writing its own copy.

- Pipeline order (`Sequential`, `OneFOneB`): in what order a pipeline stage runs the forward
  and backward passes of the micro-batches of a step.
- Optimizer placement (`GpuAdam`, `TorchCpuAdam`; DeepSpeed's offloaded steps in
  sim.engines.offload): where the optimizer steps its parameters and what the compute stream
  waits for before the next step.
- Gradient bucketing (sim.engines.buckets: `DdpBucket`, `DeepSpeedBucket`) decides when a
  reduction is issued; the engine decides which collective reduces the bucket.

The parameter gathering of ZeRO-3 (per-module fetch and prefetch), FSDP2 (per-unit gathers)
and the paper's ZeRO-3 (per-segment broadcasts) are three different algorithms, each in its
engine module.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from sim.engines.builder import Builder
from sim.engines.schedule import Alloc, OpRef, Phase, Stream


class Part(StrEnum):
    """What of a micro-step a pipeline stage runs at one point of its order."""

    FORWARD = "F"
    BACKWARD = "B"
    BOTH = "FB"


class PipelineOrder(Protocol):
    def order(self, micro_steps: int, stages: int, stage: int) -> list[tuple[int, Part]]: ...


class Sequential:
    """No pipeline: each micro-step's forward and backward, one micro-step after another."""

    def order(self, micro_steps: int, stages: int, stage: int) -> list[tuple[int, Part]]:
        return [(i, Part.BOTH) for i in range(micro_steps)]


class OneFOneB:
    """1F1B (PipeDream-Flush, Narayanan et al. 2021 Sec. 2.2): stage k runs p - k - 1 warm-up
    forwards, then one forward and one backward in turn, then the remaining backwards."""

    def order(self, micro_steps: int, stages: int, stage: int) -> list[tuple[int, Part]]:
        warmup = min(stages - stage - 1, micro_steps)
        order = [(i, Part.FORWARD) for i in range(warmup)]
        for i in range(micro_steps - warmup):
            order += [(warmup + i, Part.FORWARD), (i, Part.BACKWARD)]
        return order + [(i, Part.BACKWARD) for i in range(micro_steps - warmup, micro_steps)]


def pipeline_order(stages: int) -> PipelineOrder:
    return OneFOneB() if stages > 1 else Sequential()


class OptimizerPlacement(Protocol):
    def step(self, b: Builder, micro_step: int, params: float, deps: Iterable[OpRef | None]) -> OpRef:
        """Issue the optimizer step over `params` parameters after `deps`; the compute
        stream's next op waits for whatever the step leaves it to wait for."""
        ...


@dataclass(frozen=True, slots=True)
class GpuAdam:
    """Adam on the GPU, memory-bound (sim.analytic.opcost.gpu_adam_time); `holds` are buffers
    alive while it runs (DeepSpeed's fp32 gradient partition or sub-group); `tensors` the
    tensors it steps one by one or in foreach lists (a flat partition is one)."""

    implementation: str
    tensors: int = 1
    holds: tuple[Alloc, ...] = ()

    def step(self, b: Builder, micro_step: int, params: float, deps: Iterable[OpRef | None]) -> OpRef:
        return b.gpu_optimizer(f"optimizer step (Adam, {self.implementation})", micro_step, params=params, deps=deps,
                               holds=self.holds, implementation=self.implementation, tensors=self.tensors)


@dataclass(frozen=True, slots=True)
class TorchCpuAdam:
    """FSDP2's CPUOffloadPolicy: torch's Adam on the host, `slowdown` times DeepSpeedCPUAdam's
    time ("5x to 7x", deepspeed/ops/adam/cpu_adam.py); the compute stream waits for it."""

    slowdown: float

    def step(self, b: Builder, micro_step: int, params: float, deps: Iterable[OpRef | None]) -> OpRef:
        cpu = b.cpu_step("torch Adam on CPU", micro_step, params=params * self.slowdown, deps=deps)
        b.stream_wait(Stream.COMPUTE, cpu)
        return b.compute("wait for the CPU step", Phase.STEP, micro_step)
