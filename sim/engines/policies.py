"""Policies the engine planners are composed of, instead of each engine writing its own copy.

- Pipeline order (`Sequential`, `OneFOneB`, `Interleaved`): in what order a pipeline stage
  runs the forward and backward passes of the micro-batches of a step;
  `DeepSpeedTrainSchedule`: DeepSpeed's PipelineEngine instructions, the same passes in
  the 1F1B order with its receives and blocking sends placed as it issues them.
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

from sim.core.enums import Engine
from sim.engines.builder import Builder
from sim.engines.schedule import Alloc, Direction, OpRef, Phase, Stream
from sim.inputs.scenario import Scenario


class Part(StrEnum):
    """What of a micro-step a pipeline stage runs at one point of its order."""

    FORWARD = "F"
    BACKWARD = "B"
    BOTH = "FB"


class PipelineOrder(Protocol):
    def order(self, micro_steps: int, stages: int, stage: int) -> list[tuple[int, Part, int]]:
        """(micro-step, part, local model chunk) in the order stage `stage` runs them."""
        ...


class Sequential:
    """No pipeline: each micro-step's forward and backward, one micro-step after another."""

    def order(self, micro_steps: int, stages: int, stage: int) -> list[tuple[int, Part, int]]:
        return [(i, Part.BOTH, 0) for i in range(micro_steps)]


class OneFOneB:
    """1F1B (PipeDream-Flush, Narayanan et al. 2021 Sec. 2.2): stage k runs p - k - 1 warm-up
    forwards, then one forward and one backward in turn, then the remaining backwards."""

    def order(self, micro_steps: int, stages: int, stage: int) -> list[tuple[int, Part, int]]:
        warmup = min(stages - stage - 1, micro_steps)
        order = [(i, Part.FORWARD, 0) for i in range(warmup)]
        for i in range(micro_steps - warmup):
            order += [(warmup + i, Part.FORWARD, 0), (i, Part.BACKWARD, 0)]
        return order + [(i, Part.BACKWARD, 0) for i in range(micro_steps - warmup, micro_steps)]


@dataclass(frozen=True, slots=True)
class Interleaved:
    """Megatron's interleaved 1F1B (Narayanan et al. 2021 Sec. 2.2; megatron/core/
    pipeline_parallel/schedules.py `forward_backward_pipelining_with_interleaving`): each
    stage holds `chunks` model chunks and runs m x chunks forward and backward passes. Pass i
    (in issue order, forward or backward) is of chunk (i mod (p chunks)) // p (backward:
    counted from the last chunk) and of micro-batch (i // (p chunks)) p + i mod p; stage k
    runs 2 (p - k - 1) + (chunks - 1) p warm-up forwards, then one forward and one backward
    in turn, then the remaining backwards. The bubble is (p - 1) / chunks micro-batch passes
    of the non-interleaved schedule."""

    chunks: int

    def order(self, micro_steps: int, stages: int, stage: int) -> list[tuple[int, Part, int]]:
        total = micro_steps * self.chunks
        warmup = min(2 * (stages - stage - 1) + (self.chunks - 1) * stages, total)

        def at(i: int, part: Part) -> tuple[int, Part, int]:
            group = stages * self.chunks
            chunk = (i % group) // stages
            if part is Part.BACKWARD:
                chunk = self.chunks - 1 - chunk
            return (i // group) * stages + i % stages, part, chunk
        order = [at(i, Part.FORWARD) for i in range(warmup)]
        for i in range(total - warmup):
            order += [at(warmup + i, Part.FORWARD), at(i, Part.BACKWARD)]
        return order + [at(i, Part.BACKWARD) for i in range(total - warmup, total)]


class Pipe(StrEnum):
    """A DeepSpeed pipeline instruction (deepspeed/runtime/pipe/schedule.py)."""

    PASS = "pass"         # ForwardPass / BackwardPass
    SEND = "send"         # SendActivation (forward) / SendGrad (backward)
    RECV = "recv"         # RecvActivation (forward) / RecvGrad (backward)


@dataclass(frozen=True, slots=True)
class DeepSpeedTrainSchedule:
    """DeepSpeed's PipelineEngine schedule (deepspeed/runtime/pipe/schedule.py
    `TrainSchedule.steps`, `_step_to_micro_batch`): 2 (m + p - 1) steps; in step t stage k
    runs a forward when t and k have the same parity, else a backward, of the micro-batch
    the step maps to (none when out of range: the step only communicates). Each step first
    exchanges: the output of the stage's previous step leaves (a forward step sends the
    previous backward's gradient, a backward step the previous forward's activation) and
    the pass's own input arrives. Up to v0.8, a forward step received first and a backward
    step sent first; from v0.9.0 (PR #2862, 2023-03) a forward step sends first and a
    backward step receives first (`send_first`; recorded on v0.19.8 by
    tests/validation/test_deepspeed_pipeline_runs.py). The passes come out in `OneFOneB`'s
    order either way (tests/unit/test_deepspeed_pipe_schedule.py); what differs from it is
    where the sends go and that every send and receive blocks (pipe/p2p.py: `dist.send` /
    `dist.recv`)."""

    send_first: bool = False

    def instructions(self, micro_steps: int, stages: int, stage: int) -> list[tuple[Pipe, Direction, int]]:
        """(instruction, direction, micro-batch) in the order stage `stage` issues them;
        the direction of a transfer is that of the data (forward: an activation)."""
        out: list[tuple[Pipe, Direction, int]] = []
        valid = range(micro_steps)
        previous = -1
        for step in range(2 * (micro_steps + stages - 1)):
            mb, forward = self._micro_batch(step, stages, stage)
            if (forward and stage > 0) or (not forward and stage < stages - 1):
                direction = Direction.FORWARD if forward else Direction.BACKWARD
                other = Direction.BACKWARD if forward else Direction.FORWARD
                arrives = [(Pipe.RECV, direction, mb)] if mb in valid else []
                leaves = [(Pipe.SEND, other, previous)] if previous in valid else []
                receive_first = forward != self.send_first
                out += arrives + leaves if receive_first else leaves + arrives
            if mb in valid:
                out.append((Pipe.PASS, Direction.FORWARD if forward else Direction.BACKWARD, mb))
            previous = mb
        return out

    @staticmethod
    def _micro_batch(step: int, stages: int, stage: int) -> tuple[int, bool]:
        """`_step_to_micro_batch`: the micro-batch of `step` on `stage`, and whether forward."""
        if step % 2 == stage % 2:
            return (step - stage % 2) // 2 - stage // 2, True
        if step % 2 == 0:
            return step // 2 - stages + (stage + 1) // 2, False
        return (step - 1) // 2 - stages + 1 + stage // 2, False


def deepspeed_pipeline(s: Scenario) -> bool:
    """DeepSpeed's PipelineEngine runs the stages (its own schedule and blocking p2p); with
    virtual stages, a Megatron-only option, never."""
    return s.engine is Engine.DEEPSPEED and s.parallel.pp > 1 and s.parallel.virtual_stages == 1


def pipe_partitioned(s: Scenario) -> bool:
    """DeepSpeed's PipelineEngine under TP sends 1/tp of each activation and gradient
    (`is_pipe_partitioned`, `is_grad_partitioned`); an activation already split by sequence
    parallelism is sent as it is here."""
    return deepspeed_pipeline(s) and s.parallel.tp > 1 and not s.parallel.sequence_parallel


def pipeline_order(stages: int, chunks: int = 1) -> PipelineOrder:
    if chunks > 1:
        return Interleaved(chunks)
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
