"""The host thread of a rank: it issues every op, in issue (id) order, and pays CPU time for
each; a device op cannot start before the host has issued it.

Each op costs the host its kernel launches (framework dispatch included: `[host]
launch_us` per kernel), a collective call (`collective_launch_us`), and the framework
hooks the planner attached to it (`hooks` x `zero3_hook_us` or `fsdp2_hook_us`, and
`pieces` x `zero3_rank_piece_us` for ZeRO-3's per-rank slicing in Python). The host
runs ahead of the device freely (CUDA's launch queue is deep) except where it synchronises
(`Op.synced`: cudaEventSynchronize / .item() / a DeepSpeed fetch-event wait): then it
waits for that op to end. So the issue time of op i is

    H(i) = max(H(s - 1), end(sync op of s)) + sum of costs from s to i,

where s is the last op at or before i at which the host synchronised. When the host is
slower than the device (many small kernels, ZeRO-3's per-module hooks) the device waits
for it: the step is host-bound, and the wait is attributed as exposed host time.

A synchronous host (`[host] synchronous`: a CPU process of the gloo validation runs, whose
'device' is the thread that issues the work) runs nothing ahead: each op's host cost is
paid on the compute stream before the next compute op in issue order (`fold_synchronous`),
as the Python hooks of FSDP2 and DeepSpeed run inline between the modules' kernels there.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from operator import attrgetter

from sim.analytic.kernels import Kernel
from sim.analytic.opcost import adam_launches
from sim.core.enums import Engine
from sim.core.specs import HostSpec
from sim.engines.schedule import AnyOp, Collective, Compute, CpuStep, GpuOptimizer, Send, Stream


def host_cost(op: AnyOp, host: HostSpec, engine: Engine) -> float:
    """Seconds of host CPU to issue `op`."""
    return hook_cost(op, host, engine) + launches(op) * (
        host.collective_launch if isinstance(op, Collective | Send) else host.launch)


def fold_synchronous(ops: Iterable[AnyOp], duration: dict[int, float | None], host: HostSpec,
                     engine: Engine) -> None:
    """Add each op's host cost to the duration of the next compute-stream op that has one
    (Compute or GpuOptimizer), in issue order; what follows the last goes to the last."""
    pending, last = 0.0, None
    for op in sorted(ops, key=attrgetter("id")):
        pending += host_cost(op, host, engine)
        seconds = duration.get(op.id)
        if op.stream is Stream.COMPUTE and isinstance(op, Compute | GpuOptimizer) and seconds is not None:
            duration[op.id], pending, last = seconds + pending, 0.0, op.id
    if pending and last is not None:
        duration[last] = (duration[last] or 0.0) + pending


def hook_cost(op: AnyOp, host: HostSpec, engine: Engine) -> float:
    """The framework's Python work for `op`: its module hook calls, and the per-rank tensor
    slices of ZeRO-3's coalesced gathers and reductions (`pieces` x `zero3_rank_piece_us`)."""
    hook = host.zero3_hook if engine is Engine.DEEPSPEED else host.fsdp2_hook if engine is Engine.FSDP2 else 0.0
    return op.hooks * hook + op.pieces * host.zero3_rank_piece


def launches(op: AnyOp) -> int:
    """Kernel (or collective) launches the host makes for `op`."""
    if isinstance(op, Compute):
        return len(op.kernels)
    if isinstance(op, GpuOptimizer):
        return adam_launches(op.implementation, op.tensors)
    return 0 if isinstance(op, CpuStep) else 1


@dataclass
class HostPlan:
    """Per rank class: the prefix sums of host costs in id order, the sync points, and per
    op when its first launch is issued (`lead`, from the start of its host work) and the
    latest its last kernel can end given the host's launches (`tail`: a kernel cannot start
    before its launch, so an op of kernels k_0 .. k_n ends no earlier than
    max_j(hooks + (j + 1) launch + d_j + ... + d_n) after its host work began)."""

    prefix: list[float]                 # prefix[i] = cost of ops 0 .. i-1
    sync_ids: list[int]                 # ids of ops issued right after a host sync, ascending
    sync_on: list[tuple[int, ...]]      # the ops each of them waited for
    lead: list[float]
    tail: list[float]

    @staticmethod
    def of(ops: Iterable[AnyOp], host: HostSpec, engine: Engine, kernel_seconds: Callable[[Kernel], float]) -> HostPlan:
        by_id = sorted(ops, key=attrgetter("id"))   # ids are 0 .. n-1 within a class (Builder)
        hook = host.zero3_hook if engine is Engine.DEEPSPEED else host.fsdp2_hook if engine is Engine.FSDP2 else 0.0
        launch, call = host.launch, host.collective_launch
        prefix, lead, tail = [0.0], [], []
        syncs: list[tuple[int, tuple[int, ...]]] = []
        tails: dict[tuple[int, float], float] = {}     # identical kernel tuples (replayed parts) share it
        total = 0.0
        piece = host.zero3_rank_piece
        for op in by_id:
            hooks = op.hooks * hook + op.pieces * piece
            kind = type(op)
            if isinstance(op, Compute) and op.kernels:
                kernels = op.kernels
                cost = hooks + launch * len(kernels)
                lead.append(hooks + launch)
                key = (id(kernels), hooks)
                if key not in tails:
                    tails[key] = _tail(kernels, hooks, launch, kernel_seconds)
                tail.append(tails[key])
            elif isinstance(op, GpuOptimizer):   # starts at its first launch, ends after its last
                cost = hooks + launch * adam_launches(op.implementation, op.tensors)
                lead.append(hooks + launch)
                tail.append(cost)
            else:
                cost = hooks + (0.0 if kind is Compute or kind is CpuStep
                                else call if kind is Collective or kind is Send else launch)
                lead.append(cost)
                tail.append(0.0)
            total += cost
            prefix.append(total)
            if op.synced:
                syncs.append((op.id, op.synced))
        return HostPlan(prefix, [s for s, _ in syncs], [g for _, g in syncs], lead, tail)

    @property
    def busy(self) -> bool:
        return self.prefix[-1] > 0.0


def _tail(kernels: tuple[Kernel, ...], hooks: float, launch: float, kernel_seconds: Callable[[Kernel], float]) -> float:
    times = [kernel_seconds(k) for k in kernels]
    best, suffix = 0.0, 0.0
    for j in range(len(times) - 1, -1, -1):
        suffix += times[j]
        best = max(best, hooks + (j + 1) * launch + suffix)
    return best


class HostClock:
    """The host of one rank in one step: when it begins issuing each op, segment by segment."""

    def __init__(self, plan: HostPlan, start: float, ends: dict[int, float]) -> None:
        self.plan, self.start, self.ends = plan, start, ends
        self.base: list[float] = []     # issue time before the first op of each sync segment

    def begins(self, op_id: int) -> float:
        """When the host begins its work for op `op_id` (it has issued every op before)."""
        p = self.plan
        segment = bisect_right(p.sync_ids, op_id)       # 0: before any sync
        while len(self.base) <= segment:
            k = len(self.base)
            if k == 0:
                self.base.append(self.start)
                continue
            first = p.sync_ids[k - 1]
            self.base.append(max(self._begins(k - 1, first), *(self.ends[g] for g in p.sync_on[k - 1])))
        return self._begins(segment, op_id)

    def _begins(self, segment: int, op_id: int) -> float:
        first = 0 if segment == 0 else self.plan.sync_ids[segment - 1]
        return self.base[segment] + self.plan.prefix[op_id] - self.plan.prefix[first]
