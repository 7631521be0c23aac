"""The Schedule: per rank class, per stream, the ordered ops and their dependencies.

Pure data, no SimPy: the planner (sim/engines) writes it; the engine (sim/engine)
decides when each op runs; the analytic twin sums its volumes and costs. CUDA stream
semantics: ops of one stream run in order; `deps` are events recorded on other streams
(or host-side waits) that must complete before an op may start.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar, NewType

from sim.analytic.kernels import Kernel
from sim.core.enums import Axis, Coll


class Stream(StrEnum):
    COMPUTE = "compute"
    ALLGATHER = "comm (all-gather)"     # DeepSpeed ZeRO-3 / FSDP2 all-gather stream
    REDUCE = "comm (reduce)"            # reduction / reduce-scatter stream (also DDP's comm)
    ALLREDUCE = "comm (all-reduce)"     # FSDP2 HSDP: the replicate group's all-reduce of each shard
    P2P = "comm (p2p)"                  # pipeline sends
    TP = "comm (tp)"                    # TP collectives overlapped with GEMMs (Megatron tp_comm_overlap)
    H2D = "h2d"
    D2H = "d2h"
    CPU = "cpu"
    NVME_READ = "nvme read"      # ZeRO-Infinity swap-in (aio reads into pinned host buffers)
    NVME_WRITE = "nvme write"    # ZeRO-Infinity swap-out


class Phase(StrEnum):
    FWD = "fwd"
    BWD = "bwd"
    STEP = "step"


class Kind(StrEnum):
    COMPUTE = "compute"
    OPTIMIZER = "optimizer"
    COLLECTIVE = "collective"
    COPY = "copy"
    CPU_OPTIMIZER = "cpu optimizer"


class Mem(StrEnum):
    """Memory categories of the results contract."""

    PARAMS = "params"
    GRADS = "grads"
    OPTIMIZER = "optimizer"
    ACTIVATIONS = "activations"
    NVME = "nvme"               # state swapped to the node's NVMe (ZeRO-Infinity): a host-side allocation
    BUFFERS = "buffers"


@dataclass(frozen=True, slots=True)
class Alloc:
    category: Mem
    label: str
    nbytes: float


OpRef = NewType("OpRef", int)
"""A dependency token: the completion of an op of the same rank class (its id)."""


class Direction(StrEnum):
    """Which way a pipeline transfer goes."""

    FORWARD = "F"      # activations to the next stage
    BACKWARD = "B"     # their gradients to the previous stage


@dataclass(frozen=True, slots=True)
class PipeTag:
    """What a pipeline receive waits for: the send of micro-step `micro_step` in `direction`
    by model chunk `chunk` (the sender's place in the whole pipeline: stage, or with
    interleaving local chunk x pp + stage). `ready`: not the data but the receiver's
    notice that it has posted the receive (DeepSpeed's blocking pairs: the sender's transfer
    starts only then); `chunk` is then the receiver's."""

    direction: Direction
    micro_step: int
    chunk: int = 0
    ready: bool = False

    def __str__(self) -> str:
        return (f"{'ready ' if self.ready else ''}{self.direction.value}{self.micro_step}"
                + (f"c{self.chunk}" if self.chunk else ""))


@dataclass(slots=True, kw_only=True)
class Op:
    """What every op has: one operation on one stream of one rank (the same for all ranks of
    a class). Ops are made once, by `Builder.finish`, and never changed after (not frozen
    only because a frozen dataclass costs three times as much to build). `deps` are ops of other streams (or host-side waits) that must end first;
    `waits_for` are pipeline sends from a neighbouring stage that must arrive first. The host
    issues ops in id order (sim.des.host): `synced` is where it blocked first (a host sync),
    `hooks` the framework hook calls it ran for this op (ZeRO-3 and FSDP2 module hooks),
    `pieces` the (rank, tensor) slices DeepSpeed ZeRO-3 handles one by one in Python for it."""

    kind: ClassVar[Kind]
    id: int
    stream: Stream
    name: str
    phase: Phase
    micro_step: int
    layer: int | None = None            # transformer block, None outside the blocks
    deps: tuple[int, ...] = ()
    alloc: tuple[Alloc, ...] = ()       # taken when the op starts
    free: tuple[Alloc, ...] = ()        # given back when the op ends
    purpose: str = ""                   # e.g. 'fetch', 'prefetch', 'grad bucket', 'post-step'
    waits_for: tuple[PipeTag, ...] = ()
    synced: tuple[int, ...] = ()        # the ops the host waited for before issuing this one
    hooks: int = 0                      # framework hook calls the host runs before issuing it
    pieces: int = 0                     # per-rank tensor slices the host handles for it (ZeRO-3)


@dataclass(slots=True, kw_only=True)
class Compute(Op):
    """Device kernels run back to back on the compute stream (sim.analytic.kernels; their
    times: sim.analytic.kernel_time). One module's kernels, or several modules' when
    nothing can start between them (Builder.compute `join`); none for a pure ordering point."""

    kind: ClassVar[Kind] = Kind.COMPUTE
    kernels: tuple[Kernel, ...] = ()
    joined: tuple[str, ...] = ()        # the module ops joined into this one, in order

    @property
    def flops(self) -> float:
        return sum(k.flops for k in self.kernels)

    def module_ops(self) -> tuple[str, ...]:
        """The names of the module ops this op runs (itself, unless joined)."""
        return self.joined or (self.name,)


@dataclass(slots=True, kw_only=True)
class GpuOptimizer(Op):
    """Adam over `params` parameters in `tensors` tensors on the GPU (memory-bound), run by
    `implementation` (sim.core.enums.OptimizerImpl)."""

    kind: ClassVar[Kind] = Kind.OPTIMIZER
    params: float
    implementation: str = "fused"
    tensors: int = 1


@dataclass(slots=True, kw_only=True)
class CpuStep(Op):
    """CPU-Adam over `params` parameters on the host (ZeRO-Offload, FSDP2 CPU offload), and
    `host_bytes` of other host-memory traffic (a dtype cast before a copy to the device)."""

    kind: ClassVar[Kind] = Kind.CPU_OPTIMIZER
    params: float
    host_bytes: float = 0.0


@dataclass(slots=True, kw_only=True)
class Collective(Op):
    """A collective on the group along `axis`; `nbytes` is the buffer S (nccl-tests)."""

    kind: ClassVar[Kind] = Kind.COLLECTIVE
    coll: Coll
    axis: Axis
    nbytes: float


@dataclass(slots=True, kw_only=True)
class Send(Op):
    """A pipeline send of `nbytes` to the stage `peer` away (+1 next, -1 previous); the
    receiving stage's op that `waits_for` `tag` starts once it has arrived."""

    kind: ClassVar[Kind] = Kind.COLLECTIVE
    coll: ClassVar[Coll] = Coll.SEND_RECV
    axis: ClassVar[Axis] = Axis.PP
    nbytes: float
    tag: PipeTag
    peer: int


@dataclass(slots=True, kw_only=True)
class Copy(Op):
    """A PCIe copy of `nbytes` in `direction` (H2D or D2H), on its own stream or another;
    `pageable`: from or to pageable host memory (HostSpec.pcie_pageable_efficiency);
    `fresh`: a D2H into a tensor it allocates (`.to("cpu")`), whose pages the copy touches
    first (HostSpec.fresh_pageable_d2h)."""

    kind: ClassVar[Kind] = Kind.COPY
    nbytes: float
    direction: Stream
    pageable: bool = False
    fresh: bool = False


AnyOp = Compute | GpuOptimizer | CpuStep | Collective | Send | Copy
CommOp = Collective | Send


@dataclass
class ClassSchedule:
    """The ops of one rank class (one pipeline stage), by stream, plus resident memory."""

    streams: dict[Stream, list[AnyOp]] = field(default_factory=dict)
    resident: list[Alloc] = field(default_factory=list)  # allocated before the step starts
    host: list[Alloc] = field(default_factory=list)      # held in host memory, per rank
    # facts the engine derives from the ops alone (sim.des.class_plan), each kept with the
    # shape of the streams it was derived from: a fit simulates one schedule many times
    derived: dict[str, tuple[object, object]] = field(default_factory=dict, repr=False, compare=False)

    def ops(self) -> Iterator[AnyOp]:
        for stream in Stream:
            yield from self.streams.get(stream, [])

    def shape(self) -> tuple[tuple[Stream, int, int], ...]:
        """Each stream's length and the id of its last op: what appending ops changes."""
        return tuple((stream, len(ops), ops[-1].id if ops else -1) for stream, ops in self.streams.items())


@dataclass
class Schedule:
    """What happens in one optimizer step, for every rank class."""

    strategy: str
    classes: list[ClassSchedule]
    notes: list[str] = field(default_factory=list)

    def ops(self, cls: int = 0) -> Iterator[AnyOp]:
        return self.classes[cls].ops()

    def ops_by_id(self, cls: int) -> dict[int, AnyOp]:
        cache = self._by_id.get(cls)
        if cache is None:
            cache = self._by_id[cls] = {op.id: op for op in self.classes[cls].ops()}
        return cache

    def __post_init__(self) -> None:
        self._by_id: dict[int, dict[int, AnyOp]] = {}
