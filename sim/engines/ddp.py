"""PyTorch DDP, alone or with ZeroRedundancyOptimizer (torch/nn/parallel/distributed.py,
torch/distributed/optim/zero_redundancy_optimizer.py; reference 2.5).

With bf16/fp16 the torch engines run autocast: parameters, gradients and Adam states stay
fp32, so DDP all-reduces fp32 gradients. Buckets (25 MB, the first 1 MiB) are all-reduced
on the comm stream as soon as their gradients are ready; during accumulation `no_sync`
skips the all-reduce until the last micro-step. At that step the reducer copies each
gradient into its bucket (scaled by 1/dp) and, after the all-reduces, back into `.grad`
(`gradient_as_bucket_view=False`, torch's default): two passes over the gradients on the
compute stream. The optimizer waits for every bucket.
ZeroRedundancyOptimizer keeps Adam state only for the tensors it owns (a greedy,
largest-first assignment of whole tensors), steps them, then broadcasts every parameter
from its owner; the step waits for the most loaded rank.
"""

from __future__ import annotations

import heapq

from sim.analytic.kernels import memory
from sim.analytic.placement import TensorGroup, census_numel, rank_tensors, trainable
from sim.analytic.volumes import ddp_engine_volume
from sim.core.enums import Coll, Engine, ScheduleMode
from sim.core.model import module_buffers
from sim.engines.buckets import DdpBucket
from sim.engines.layout import Layout
from sim.engines.model import EngineModel
from sim.engines.policies import GpuAdam
from sim.engines.resident import Resident, frozen_base, resident
from sim.engines.schedule import Alloc, Direction, Mem, OpRef, Phase, Stream
from sim.engines.skeleton import Planner
from sim.engines.uses import B, F, Use
from sim.inputs.scenario import Scenario


def greedy_partition(numels: list[int], ranks: int) -> list[list[int]]:
    """ZeroRedundancyOptimizer `_partition_parameters`: sort by size, largest first, each
    to the rank with the smallest total so far (ties: lowest rank)."""
    loads = [0] * ranks
    owned: list[list[int]] = [[] for _ in range(ranks)]
    for idx in sorted(range(len(numels)), key=lambda i: (-numels[i], i)):
        r = min(range(ranks), key=lambda k: (loads[k], k))
        loads[r] += numels[idx]
        owned[r].append(idx)
    return owned


class DdpPlanner(Planner):
    name = "ddp"
    per_module = True   # gradient hooks fire per parameter, as each module's backward ends

    def __init__(self, s: Scenario, layout: Layout, stage: int = 0) -> None:
        super().__init__(s, layout, stage)
        self.grad_bytes = 4  # autocast keeps fp32 gradients
        self.zero1 = self.s.engine is Engine.DDP_ZERO_REDUNDANCY
        assert self.s.ddp is not None
        self.bucket = DdpBucket(self.s.ddp.bucket_cap, self.grad_bytes)
        self.broadcast = self.s.ddp.broadcast_buffers
        self.reductions: list[OpRef] = []
        self.tensors = [t for g in self.granules for t in g.grad_tensors]   # those with gradients
        self.owned = greedy_partition(self.tensors, self.dp) if self.zero1 else []

    def resident_allocations(self, census: list[TensorGroup]) -> Resident:
        return ddp_resident(self.s, census)

    def optimizer_params(self) -> float:
        if not self.zero1:
            return float(self.grad_psi)
        return float(max(sum(self.tensors[i] for i in own) for own in self.owned))

    def optimizer_tensors(self) -> int:
        """Tensors the rank's Adam steps: all, or those the most loaded rank owns."""
        if not self.zero1:
            return len(self.tensors)
        return len(max(self.owned, key=lambda own: sum(self.tensors[i] for i in own)))

    def part_key(self, ms: int, direction: Direction) -> tuple[bool, bool]:
        """Micro-steps differ only in the first (buffer broadcast) and the last (gradient sync)."""
        return (ms == 0, ms == self.boundary)

    def before_use(self, use: Use) -> list[OpRef | None]:
        """`broadcast_buffers`: DDP's pre-forward broadcasts rank 0's module buffers, coalesced
        (`_broadcast_coalesced`, 250 MiB buckets), when the previous forward ran with gradient
        sync (`require_forward_param_sync`, initially true): under `no_sync` accumulation that
        is the first micro-step of every optimizer step."""
        buffers = sum(b.numel * b.element_bytes for b in module_buffers(self.m))
        if use.what is not F or use.index != 0 or use.micro_step != 0 or not self.broadcast or not buffers:
            return []
        return [self.collective(Stream.COMPUTE, Coll.BROADCAST, buffers, "DDP buffer broadcast", Phase.FWD,
                                0, purpose="buffers")]

    def after_use(self, use: Use, op: OpRef) -> None:
        """At the sync micro-step each ready gradient is copied into its bucket, divided by
        dp on the way (reducer.cpp `mark_variable_ready_dense`: `mul_out` into the bucket
        view, `gradient_as_bucket_view=False`), on the compute stream; full buckets are
        all-reduced."""
        g = self.granules[use.index]
        if use.what is not B or use.micro_step != self.boundary or not g.grad_numel:
            return
        copy = self.compute("DDP copy gradients into buckets", Phase.BWD, use.micro_step,
                            (memory("grad -> bucket view (x 1/dp)", 2.0 * self.grad_bytes * g.grad_numel),), g.block,
                            [op])
        for numel in reversed(g.grad_tensors):
            for size in self.bucket.add(numel):
                self._all_reduce(size, copy, use)

    def _all_reduce(self, elements: int, op: OpRef, use: Use) -> None:
        self.reductions.append(self.collective(
            Stream.REDUCE, Coll.ALL_REDUCE, elements * self.grad_bytes, "DDP bucket all-reduce",
            Phase.BWD, use.micro_step, deps=[op], layer=self.granules[use.index].block,
            purpose="grad bucket"))

    def end_of_backward(self, ms: int) -> None:
        if ms != self.boundary:
            return
        last = self.b.last(Stream.COMPUTE)
        for size in self.bucket.flush():
            self.reductions.append(self.collective(Stream.REDUCE, Coll.ALL_REDUCE, size * self.grad_bytes,
                                                   "DDP bucket all-reduce", Phase.BWD, ms, deps=[last],
                                                   purpose="grad bucket"))
        self.wait_before_next_compute(self.reductions[-1] if self.reductions else None)
        # finalize_backward: each bucket's result copied back into the .grad tensors
        self.compute("DDP copy buckets back to gradients", Phase.BWD, ms,
                     (memory("bucket view -> grad", 2.0 * self.grad_bytes * self.grad_psi),), None)

    def optimizer_step(self) -> None:
        norm = self.grad_norm()
        step = self.optimizer(GpuAdam(self.t.optimizer, self.optimizer_tensors()), self.optimizer_params(), [norm])
        if not self.zero1:
            return
        # _sync_params: for each rank in turn, a broadcast of every tensor it owns, in the order
        # they were assigned (largest first); all async, then waited.
        last: OpRef | None = None
        for owner, owned in enumerate(self.owned):
            for idx in owned:
                last = self.collective(Stream.REDUCE, Coll.BROADCAST, self.tensors[idx] * 4.0,
                                       f"ZeroRedundancy broadcast from rank {owner}", Phase.STEP, self.boundary,
                                       deps=[step], purpose="post-step")
        self.wait_before_next_compute(last)
        self.compute("sync (wait for broadcasts)", Phase.STEP, self.boundary, (), None)

    def notes(self) -> list[str]:
        out = ["autocast: fp32 parameters, gradients and Adam states; fp32 gradient all-reduce"]
        if self.zero1:
            loads = [sum(self.tensors[i] for i in own) for own in self.owned]
            out.append(f"ZeroRedundancyOptimizer greedy partition: most loaded rank holds "
                       f"{max(loads) / (sum(loads) / len(loads)):.3f} x the mean")
        return out


def ddp_resident(s: Scenario, census: list[TensorGroup]) -> Resident:
    """fp32 parameters, gradients, bucket copies and Adam m, v of the tensors with gradients;
    LoRA's frozen base in 16 bits (sim.engines.resident.frozen_base)."""
    learned = trainable(census)
    psi = census_numel(learned)
    optimizer_params = psi
    if s.engine is Engine.DDP_ZERO_REDUNDANCY:
        optimizer_params = max(greedy_loads(learned, s.parallel.dp))
    return resident(s, [*frozen_base(census), Alloc(Mem.PARAMS, "fp32 parameters", 4.0 * psi),
                        Alloc(Mem.GRADS, "fp32 gradients", 4.0 * psi),
                        Alloc(Mem.BUFFERS, "DDP gradient buckets", 4.0 * psi),
                        Alloc(Mem.OPTIMIZER, "Adam m and v", 8.0 * optimizer_params)], [])


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


def ddp_volume(s: Scenario) -> dict[str, float]:
    """fp32 gradients all-reduced once per step (+ the clipping norm), ZeroRedundancy's
    parameter broadcasts, and the module-buffer broadcast (sim.analytic.volumes)."""
    assert s.ddp is not None
    psi = sum(n for n, _ in rank_tensors(s.model, s.parallel.tp, s.stages, 0, trainable_only=True))
    buffers = sum(b.numel * b.element_bytes for b in module_buffers(s.model)) if s.ddp.broadcast_buffers else 0.0
    return ddp_engine_volume(psi, s.parallel.dp, zero_redundancy=s.engine is Engine.DDP_ZERO_REDUNDANCY,
                             clipping=s.training.gradient_clipping > 0, buffer_bytes=buffers)


DDP = EngineModel(
    name="ddp", summary="torch DistributedDataParallel (autocast, fp32 states), with or without "
                        "ZeroRedundancyOptimizer",
    applies=lambda s: s.schedule_mode is ScheduleMode.IMPLEMENTED and s.engine in (Engine.DDP,
                                                                                    Engine.DDP_ZERO_REDUNDANCY),
    planner=DdpPlanner, resident=ddp_resident, volume=ddp_volume)
