"""ZeRO-Offload's optimizer step as DeepSpeed runs it, and the ZeRO-Offload paper's delayed
parameter update, as optimizer placements (sim.engines.policies.OptimizerPlacement).

- ZeRO-1/2 (stage_1_and_2.py with `offload_optimizer`): the gradients went to the pinned fp32
  partition during backward (one D2H per bucket); the step runs DeepSpeedCPUAdam over the
  partition, casts the fp32 master to 16 bits into a pinned buffer and copies it to the GPU
  partition with `copy_(non_blocking=True)`, and the post-step all-gather follows
  (`DeepSpeedCpuAdam`, reference 1.7).
- ZeRO-3 (stage3.py `step`): the partition is cut into sub-groups (`_create_fp16_sub_groups`:
  tensors in order until a group holds `sub_group_size` elements; here, equal groups, as many
  as the partition needs). With `ratio` < 1 the first int((1 - ratio) x groups) sub-groups
  keep their fp32 state on the GPU and step with torch's AdamW there (Twin-Flow,
  DeepSpeed's blogs/deepspeed-offloadpp); the others run DeepSpeedCPUAdam. For each sub-group
  in order the host runs its optimizer, then `fp16_partitioned_groups_flat[i].copy_(
  fp32_partitioned_groups_flat[i])` (`_reassign_or_swap_out_partitioned_parameters`). For a
  CPU sub-group that is a copy across devices and dtypes, which torch performs as a cast on
  the CPU into a fresh, pageable tensor and a blocking H2D of it (aten/src/ATen/native/cuda/
  Copy.cu, copy_kernel_cuda: type conversions are performed on the CPU for CPU-GPU copies);
  so the host does one sub-group at a time: CPU-Adam, the cast, the copy, the next. For a
  GPU sub-group it is a cast kernel, and the host goes on while the GPU runs it: the GPU
  sub-groups overlap the CPU ones.
- Delayed parameter update (`DelayedUpdate`, ZeRO-Offload paper arXiv 2101.06840 Sec. 5.2;
  DeepSpeed has no switch for it): in the steady state the CPU steps with the previous
  step's gradients, already on the host, while the GPU runs this step's forward and
  backward; the updated parameters must be back before the next step's forward. So the CPU
  path starts with the step and the step takes about max(GPU path, CPU path). The host keeps
  a second fp32 gradient partition for the gradients the GPU is producing meanwhile.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from sim.analytic import kernels as kn
from sim.core.enums import OptimizerImpl
from sim.engines.builder import Builder
from sim.engines.schedule import OpRef, Phase, Stream

CAST_BYTES = 4 + 2    # the fp32 -> 16-bit cast reads 4 B and writes 2 B per parameter
SWAP_IN_BYTES = 16    # ZeRO-Infinity swap-in per parameter: fp32 master, Adam m and v, fp32 gradient
SWAP_OUT_BYTES = 12   # swap-out: fp32 master, m and v (the gradient is not written back)


def sub_groups(partition: float, size: int) -> list[float]:
    """The sub-group sizes of a rank's partition: ceil(partition / size) equal groups."""
    if size <= 0 or partition <= size:
        return [partition]
    count = math.ceil(partition / size)
    return [partition / count] * count


def cpu_share(partition: float, size: int, ratio: float) -> float:
    """The fraction of the partition that DeepSpeedCPUAdam steps: the last
    groups - int((1 - ratio) x groups) sub-groups (stage3.py `subgroup_to_device`)."""
    groups = sub_groups(partition, size)
    on_gpu = int((1.0 - ratio) * len(groups))
    return sum(groups[on_gpu:]) / partition if partition > 0 else 1.0


@dataclass(frozen=True, slots=True)
class DeepSpeedCpuAdam:
    """ZeRO-Offload at stages 1-2 (arXiv 2101.06840 Sec. 4; DeepSpeedCPUAdam): Adam on the host
    over the rank's partition, then the updated 16-bit partition copied back
    (`copy_back_bytes`) before the compute stream goes on; `pageable` copies when
    `pin_memory` is off; `delayed`: the paper's delayed parameter update (issued at the
    start of the step by the planner, `delayed_update`)."""

    copy_back_bytes: float
    pageable: bool = False
    delayed: bool = False

    def step(self, b: Builder, micro_step: int, params: float, deps: Iterable[OpRef | None]) -> OpRef:
        cpu = b.cpu_step("CPU-Adam", micro_step, params=params, deps=deps)
        up = b.copy(Stream.H2D, self.copy_back_bytes, "H2D 16-bit partition", Phase.STEP, micro_step, deps=[cpu],
                    pageable=self.pageable)
        if not self.delayed:    # delayed: the planner makes the end of the step wait for it
            b.stream_wait(Stream.COMPUTE, up)
        return up


@dataclass(frozen=True, slots=True)
class Zero3OffloadStep:
    """DeepSpeed ZeRO-3's step with `offload_optimizer`: sub-group by sub-group, the first
    ones on the GPU when `ratio` < 1, the rest CPU-Adam + CPU cast + blocking pageable H2D
    of `value_bytes` per parameter (module docstring). With the optimizer on NVMe
    (ZeRO-Infinity, `nvme`) each CPU sub-group is first swapped in (fp32 master, m, v and
    gradients: 16 B per parameter) and its states swapped out after (12 B), one after the
    other unless `pipeline_read` (the next read runs ahead) or `pipeline_write` (the write
    runs behind the next sub-group) overlap them (pipelined_optimizer_swapper.py). Where
    the 16-bit parameters live (`param_home`: gpu, cpu or nvme, `offload_param`) decides the
    copy back: an H2D, nothing (the cast writes the CPU partition), or an NVMe write."""

    sub_group_size: int
    ratio: float
    value_bytes: int
    delayed: bool = False
    nvme: bool = False
    pipeline_read: bool = False
    pipeline_write: bool = False
    param_home: str = "gpu"

    def step(self, b: Builder, micro_step: int, params: float, deps: Iterable[OpRef | None]) -> OpRef:
        wanted = [d for d in deps if d is not None]
        groups = sub_groups(params, self.sub_group_size)
        on_gpu = int((1.0 - self.ratio) * len(groups))
        last: OpRef | None = None
        for i, n in enumerate(groups[:on_gpu]):
            b.gpu_optimizer(f"optimizer step, sub-group {i} on the GPU (torch AdamW)", micro_step, params=n,
                            deps=wanted, implementation=OptimizerImpl.FOREACH.value)
            last = b.compute(f"fp32 -> 16-bit cast, sub-group {i}", Phase.STEP, micro_step,
                             kernels=(kn.memory("cast", CAST_BYTES * n),))
        previous: OpRef | None = None       # what the host waits for before the next sub-group
        began: list[OpRef | None] = list(wanted)   # what sub-group i - 1 waited for before it began
        read: OpRef | None = None
        back: OpRef | None = None           # the last H2D of updated parameters
        for i, n in enumerate(groups[on_gpu:], start=on_gpu):
            after = [previous] if previous is not None else wanted
            if self.nvme:   # read-ahead: one sub-group ahead, once the previous one has begun
                ahead = self.pipeline_read and read is not None
                read = b.copy(Stream.NVME_READ, SWAP_IN_BYTES * n, f"NVMe swap-in, sub-group {i}", Phase.STEP,
                              micro_step, deps=[read, *began] if ahead else after)
                began = list(after)
                after = [*after, read]
            adam = b.cpu_step(f"CPU-Adam, sub-group {i}", micro_step, params=n, deps=after)
            done = b.cpu_step(f"fp32 -> 16-bit cast on the CPU, sub-group {i}", micro_step, params=0.0,
                              host_bytes=CAST_BYTES * n, deps=[adam])
            if self.param_home == "gpu":
                done = back = b.copy(Stream.H2D, self.value_bytes * n, f"H2D 16-bit sub-group {i} (pageable, blocking)",
                                     Phase.STEP, micro_step, deps=[done], pageable=True)
            elif self.param_home == "nvme":
                done = b.copy(Stream.NVME_WRITE, self.value_bytes * n, f"NVMe swap-out of 16-bit sub-group {i}",
                              Phase.STEP, micro_step, deps=[done])
            previous = done
            if self.nvme:
                write = b.copy(Stream.NVME_WRITE, SWAP_OUT_BYTES * n, f"NVMe swap-out, sub-group {i}", Phase.STEP,
                               micro_step, deps=[done])
                previous = done if self.pipeline_write else write
        if previous is not None:
            if back is not None and not self.delayed:   # delayed: the planner makes the step's end wait
                b.stream_wait(Stream.COMPUTE, back)
            return back if back is not None else previous
        assert last is not None
        return last


def delayed_update(b: Builder, placement: DeepSpeedCpuAdam | Zero3OffloadStep, micro_step: int,
                   params: float) -> OpRef:
    """The delayed parameter update's CPU path, issued when the step starts: the update with
    the previous step's gradients (already on the host) runs beside this step's forward and
    backward; the planner makes the post-step work wait for the returned copy."""
    return placement.step(b, micro_step, params, ())
