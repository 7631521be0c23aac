"""What each engine keeps resident per rank, on the device and in host memory.

One source for the planners (the DES's memory pools start from `device`) and for the
scenario's own row of `zerosim memory`, so that the two always agree. Bytes follow each
engine's code (reference/engines-and-costmodels.md sections 1-2):

- DDP (torch/nn/parallel/distributed.py; autocast keeps fp32 states): fp32 parameters and
  gradients, the reducer's flat gradient buckets (a second fp32 copy of every gradient,
  `gradient_as_bucket_view=False`), Adam m and v; ZeroRedundancyOptimizer keeps m and v
  only for the tensors its greedy partition gives the rank.
- DeepSpeed ZeRO-0/1/2 (stage_1_and_2.py): 16-bit parameters, 16-bit gradients (the
  partition at stage 2), fp32 master partition and Adam m, v (12 B per partitioned
  parameter), the IPG bucket (doubled with overlap_comm). With ZeRO-Offload the fp32
  master, m, v and the fp32 gradient partition live in pinned host memory (16 B).
- DeepSpeed ZeRO-3 (stage3.py): 16-bit parameter and gradient partitions (each tensor
  padded to a multiple of dp), persistent parameters in full, fp32 master + Adam (12 B),
  the IPG bucket; offload moves the optimizer (16 B with the fp32 gradients) and, with
  `offload_param`, the 16-bit parameter partition to the host.
- FSDP2 (_fully_shard): fp32 parameter, gradient and Adam shards (dim 0 padded to a
  multiple of dp rows); `cpu_offload` keeps all of them on the host.
- The paper schedules: (2 + 2 + 12) B per parameter, each term / dp once its stage shards it.
- Every engine: the model's module buffers (sim.core.model.module_buffers).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from sim.analytic.comm import dim0_padded, flat_padded, tensor_padded
from sim.analytic.placement import TensorGroup, census_numel, stage_census
from sim.core.enums import Engine, ScheduleMode, ZeroStage
from sim.core.model import module_buffers
from sim.core.units import BYTES_PER_ELEMENT
from sim.engines.schedule import Alloc, Mem
from sim.inputs.scenario import Scenario


@dataclass(frozen=True, slots=True)
class Resident:
    """Allocations that exist before a step starts, on one rank of a pipeline stage."""

    device: tuple[Alloc, ...]
    host: tuple[Alloc, ...]

    def device_bytes(self, category: Mem) -> float:
        return sum(a.nbytes for a in self.device if a.category is category)

    @property
    def host_bytes(self) -> float:
        return sum(a.nbytes for a in self.host)


def resident_memory(s: Scenario, stage: int = 0) -> Resident:
    """The resident memory of one rank of pipeline stage `stage` under the scenario's engine."""
    census = stage_census(s.model, s.parallel.tp, s.parallel.pp, stage)
    host: list[Alloc] = []
    if s.schedule_mode is ScheduleMode.PAPER:
        device = _paper(s, census)
    elif s.engine is Engine.FSDP2:
        device, host = _fsdp2(s, census)
    elif s.engine in (Engine.DDP, Engine.DDP_ZERO_REDUNDANCY):
        device = _ddp(s, census)
    elif s.zero_stage == ZeroStage.PARAMETERS:
        device, host = _zero3(s, census)
    else:
        device, host = _zero12(s, census)
    buffers = sum(b.numel * b.element_bytes for b in module_buffers(s.model))
    device.append(Alloc(Mem.BUFFERS, "module buffers", buffers))
    return Resident(tuple(a for a in device if a.nbytes > 0), tuple(a for a in host if a.nbytes > 0))


def _half(s: Scenario) -> int:
    return BYTES_PER_ELEMENT[s.training.precision.value]


def _paper(s: Scenario, census: list[TensorGroup]) -> list[Alloc]:
    psi, h, stage = census_numel(census), _half(s), s.zero_stage
    n = {z: s.parallel.dp if stage >= z else 1 for z in ZeroStage}
    return [Alloc(Mem.PARAMS, "16-bit parameters", h * psi / n[ZeroStage.PARAMETERS]),
            Alloc(Mem.GRADS, "16-bit gradients", h * psi / n[ZeroStage.GRADIENTS]),
            Alloc(Mem.OPTIMIZER, "fp32 parameters, Adam m and v", 12.0 * psi / n[ZeroStage.OPTIMIZER])]


def _ddp(s: Scenario, census: list[TensorGroup]) -> list[Alloc]:
    psi = census_numel(census)
    optimizer_params = psi
    if s.engine is Engine.DDP_ZERO_REDUNDANCY:
        optimizer_params = max(greedy_loads(census, s.parallel.dp))
    return [Alloc(Mem.PARAMS, "fp32 parameters", 4.0 * psi), Alloc(Mem.GRADS, "fp32 gradients", 4.0 * psi),
            Alloc(Mem.BUFFERS, "DDP gradient buckets", 4.0 * psi),
            Alloc(Mem.OPTIMIZER, "Adam m and v", 8.0 * optimizer_params)]


def greedy_loads(census: list[TensorGroup], ranks: int) -> list[int]:
    """Elements per rank under ZeroRedundancyOptimizer's `_partition_parameters`: tensors
    largest first, each to the least loaded rank, ties to the lowest rank (the assignment
    itself is sim.engines.ddp.greedy_partition). Equal-size tensors are interchangeable,
    and once the loads differ by less than one tensor, `ranks` more of them go one to each
    rank in the same order, so whole rounds are added at once."""
    loads = [(0, r) for r in range(ranks)]       # a heap of (load, rank)
    sizes: dict[int, int] = {}
    for g in census:
        sizes[g.numel] = sizes.get(g.numel, 0) + g.count
    for numel in sorted(sizes, reverse=True):
        left = sizes[numel]
        while left:
            spread = max(loads)[0] - loads[0][0]
            if left >= ranks and spread < numel:
                rounds = left // ranks
                loads = [(load + rounds * numel, r) for load, r in loads]
                heapq.heapify(loads)
                left -= rounds * ranks
                continue
            load, rank = heapq.heappop(loads)
            heapq.heappush(loads, (load + numel, rank))
            left -= 1
    return [load for load, _ in sorted(loads, key=lambda lr: lr[1])]


def _zero12(s: Scenario, census: list[TensorGroup]) -> tuple[list[Alloc], list[Alloc]]:
    z, h, stage, dp = s.zero, _half(s), s.zero_stage, s.parallel.dp
    assert z is not None
    psi = census_numel(census)
    padded = flat_padded(psi, dp)
    n = dp if stage >= ZeroStage.OPTIMIZER else 1
    offload = z.offload_optimizer.enabled
    device = [Alloc(Mem.PARAMS, "16-bit parameters", h * psi)]
    if not (offload and stage >= ZeroStage.GRADIENTS):
        device.append(Alloc(Mem.GRADS, "16-bit gradients", h * padded / (dp if stage >= ZeroStage.GRADIENTS else 1)))
    host = []
    if offload:
        host.append(Alloc(Mem.OPTIMIZER, "fp32 master, Adam m and v, fp32 gradients (pinned)", 16.0 * padded / n))
    else:
        device += [Alloc(Mem.OPTIMIZER, "fp32 master parameters", 4.0 * padded / n),
                   Alloc(Mem.OPTIMIZER, "Adam m and v", 8.0 * padded / n)]
    if stage > 0:
        device.append(Alloc(Mem.BUFFERS, "IPG bucket", (2 if z.overlap_comm else 1) * h * z.reduce_bucket_size))
    return device, host


def _zero3(s: Scenario, census: list[TensorGroup]) -> tuple[list[Alloc], list[Alloc]]:
    z, h, dp = s.zero, _half(s), s.parallel.dp
    assert z is not None
    shard = sum(tensor_padded(g.numel, dp) * g.count for g in census) / dp
    device, host = [], []
    if z.offload_param.enabled:
        host.append(Alloc(Mem.PARAMS, "16-bit parameter partition (pinned)", h * shard))
    else:
        device.append(Alloc(Mem.PARAMS, "16-bit parameter partition", h * shard))
    device.append(Alloc(Mem.PARAMS, "persistent parameters", h * persistent_numel(s, census)))
    if z.offload_optimizer.enabled:
        host.append(Alloc(Mem.OPTIMIZER, "fp32 master, Adam m and v, fp32 gradients (pinned)", 16.0 * shard))
    else:
        device += [Alloc(Mem.GRADS, "16-bit gradient partition", h * shard),
                   Alloc(Mem.OPTIMIZER, "fp32 master parameters", 4.0 * shard),
                   Alloc(Mem.OPTIMIZER, "Adam m and v", 8.0 * shard)]
    device.append(Alloc(Mem.BUFFERS, "IPG bucket", h * z.reduce_bucket_size))
    return device, host


def persistent_numel(s: Scenario, census: list[TensorGroup]) -> int:
    """ZeRO-3's persistent tensors (`ds_persist`): numel <= param_persistence_threshold,
    in forward order while the running total stays <= model_persistence_threshold (when
    that cap binds, a loop over the blocks, over their small tensors only)."""
    z = s.zero
    assert z is not None
    small = [g for g in census if g.numel <= z.param_persistence_threshold]
    everything = sum(g.numel * g.count for g in small)
    if everything <= z.model_persistence_threshold:
        return everything
    inside = [i for i, g in enumerate(census) if g.in_block]
    first, last = (inside[0], inside[-1]) if inside else (len(census), len(census) - 1)
    block = [g.numel for g in census[first:last + 1] if g in small]
    order = ([g.numel for g in census[:first] if g in small]
             + block * (census[first].count if inside else 0)
             + [g.numel for g in census[last + 1:] if g in small])
    total = 0
    for numel in order:
        if total + numel <= z.model_persistence_threshold:
            total += numel
    return total


def _fsdp2(s: Scenario, census: list[TensorGroup]) -> tuple[list[Alloc], list[Alloc]]:
    assert s.fsdp is not None
    shard = sum(dim0_padded(g.shape, s.parallel.dp) * g.count for g in census) / s.parallel.dp
    if s.fsdp.cpu_offload:
        return [], [Alloc(Mem.OPTIMIZER, "fp32 parameter, gradient and Adam shards (CPUOffloadPolicy)", 16.0 * shard)]
    return [Alloc(Mem.PARAMS, "fp32 parameter shards", 4.0 * shard),
            Alloc(Mem.GRADS, "fp32 gradient shards", 4.0 * shard),
            Alloc(Mem.OPTIMIZER, "Adam m and v", 8.0 * shard)], []
