"""PyTorch DDP, alone or with ZeroRedundancyOptimizer (torch/nn/parallel/distributed.py,
torch/distributed/optim/zero_redundancy_optimizer.py; reference 2.5).

With bf16/fp16 the torch engines run autocast: parameters, gradients and Adam states stay
fp32, so DDP all-reduces fp32 gradients. Buckets (25 MB, the first 1 MiB) are all-reduced
on the comm stream as soon as their gradients are ready; during accumulation `no_sync`
skips the all-reduce until the last micro-step. The optimizer waits for every bucket.
ZeroRedundancyOptimizer keeps Adam state only for the tensors it owns (a greedy,
largest-first assignment of whole tensors), steps them, then broadcasts every parameter
from its owner; the step waits for the most loaded rank.
"""

from __future__ import annotations

from sim.core.enums import Coll, Engine
from sim.core.model import module_buffers
from sim.engines.buckets import DdpBucket
from sim.engines.layout import Layout
from sim.engines.schedule import OpRef, Phase, Stream
from sim.engines.skeleton import B, F, Planner, Use
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
        self.tensors = [t for g in self.granules for t in g.tensors]
        self.owned = greedy_partition(self.tensors, self.dp) if self.zero1 else []

    def optimizer_params(self) -> float:
        if not self.zero1:
            return float(self.psi)
        return float(max(sum(self.tensors[i] for i in own) for own in self.owned))

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
        if use.what is not B or use.micro_step != self.boundary:
            return
        for numel in reversed(self.granules[use.index].tensors):
            for size in self.bucket.add(numel):
                self._all_reduce(size, op, use)

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

    def optimizer_step(self) -> None:
        norm = self.grad_norm()
        step = self.adam(self.optimizer_params(), deps=[norm])
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
        self.compute("sync (wait for broadcasts)", Phase.STEP, self.boundary, 0.0, 0.0, None)

    def notes(self) -> list[str]:
        out = ["autocast: fp32 parameters, gradients and Adam states; fp32 gradient all-reduce"]
        if self.zero1:
            loads = [sum(self.tensors[i] for i in own) for own in self.owned]
            out.append(f"ZeroRedundancyOptimizer greedy partition: most loaded rank holds "
                       f"{max(loads) / (sum(loads) / len(loads)):.3f} x the mean")
        return out
