"""The Schedule: per rank class, per stream, the ordered ops and their dependencies.

Pure data, no SimPy: the planner (sim/engines) writes it; the engine (sim/engine)
decides when each op runs; the analytic twin sums its volumes and costs. CUDA stream
semantics: ops of one stream run in order; `deps` are events recorded on other streams
(or host-side waits) that must complete before an op may start.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from enum import StrEnum

from sim.core.enums import Axis, Coll


class Stream(StrEnum):
    COMPUTE = "compute"
    ALLGATHER = "comm (all-gather)"     # DeepSpeed ZeRO-3 / FSDP2 all-gather stream
    REDUCE = "comm (reduce)"            # reduction / reduce-scatter stream (also DDP's comm)
    P2P = "comm (p2p)"                  # pipeline sends
    H2D = "h2d"
    D2H = "d2h"
    CPU = "cpu"


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
    BUFFERS = "buffers"


@dataclass(frozen=True, slots=True)
class Alloc:
    category: Mem
    label: str
    nbytes: float


@dataclass(frozen=True, slots=True)
class Op:
    """One operation on one stream of one rank (identical for all ranks of a class)."""

    id: int
    stream: Stream
    kind: Kind
    name: str
    phase: Phase
    micro_step: int
    layer: int | None = None            # transformer block, None outside the blocks
    flops: float = 0.0                  # compute / optimizer work
    mem_bytes: float = 0.0              # HBM traffic of the GEMMs (roofline with the FLOPs)
    elementwise_bytes: float = 0.0      # HBM traffic of memory-bound kernels, added after
    coll: Coll | None = None
    axis: Axis | None = None            # the group a collective runs on
    nbytes: float = 0.0                 # collective buffer S (nccl-tests convention) or copy bytes
    params: float = 0.0                 # parameters stepped by an optimizer op
    direction: Stream | None = None     # PCIe direction of a copy (H2D or D2H)
    deps: tuple[int, ...] = ()
    alloc: tuple[Alloc, ...] = ()       # taken when the op starts
    free: tuple[Alloc, ...] = ()        # given back when the op ends
    purpose: str = ""                   # e.g. 'fetch', 'prefetch', 'grad bucket', 'post-step'
    tag: str = ""                       # a pipeline send: what the receiving stage waits for
    peer: int = 0                       # a pipeline send: +1 to the next stage, -1 to the previous
    waits_for: tuple[str, ...] = ()     # pipeline sends from another stage this op must receive


@dataclass
class ClassSchedule:
    """The ops of one rank class (one pipeline stage), by stream, plus resident memory."""

    streams: dict[Stream, list[Op]] = field(default_factory=dict)
    resident: list[Alloc] = field(default_factory=list)  # allocated before the step starts
    host: list[Alloc] = field(default_factory=list)      # held in host memory, per rank

    def ops(self) -> Iterator[Op]:
        for stream in Stream:
            yield from self.streams.get(stream, [])


@dataclass
class Schedule:
    """What happens in one optimizer step, for every rank class."""

    strategy: str
    classes: list[ClassSchedule]
    notes: list[str] = field(default_factory=list)

    def ops(self, cls: int = 0) -> Iterator[Op]:
        return self.classes[cls].ops()

    def ops_by_id(self, cls: int) -> dict[int, Op]:
        cache = self._by_id.get(cls)
        if cache is None:
            cache = self._by_id[cls] = {op.id: op for op in self.classes[cls].ops()}
        return cache

    def __post_init__(self) -> None:
        self._by_id: dict[int, dict[int, Op]] = {}


class Builder:
    """Appends ops to the streams of one class; ids are unique within the class."""

    def __init__(self) -> None:
        self.cls = ClassSchedule()
        self._next = 0
        self.host_gate: int | None = None

    def host_sync(self, op_id: int | None) -> None:
        """The host blocks until `op_id` completes: every op issued later depends on it.

        Only the newest sync is kept: sync targets lie on in-order streams, so a later
        target implies the earlier ones on its stream.
        """
        if op_id is not None:
            self.host_gate = op_id

    def add(self, stream: Stream, kind: Kind, name: str, phase: Phase, micro_step: int,
            **fields: object) -> int:
        raw = [*fields.pop("deps", ()), self.host_gate]  # type: ignore[misc]
        deps = tuple(sorted({d for d in raw if d is not None}))
        op = Op(self._next, stream, kind, name, phase, micro_step, deps=deps, **fields)  # type: ignore[arg-type]
        self.cls.streams.setdefault(stream, []).append(op)
        self._next += 1
        return op.id

    def attach(self, stream: Stream, op_id: int | None, *, alloc: tuple[Alloc, ...] = (),
               free: tuple[Alloc, ...] = ()) -> None:
        """Add memory taken / given back by an op already on `stream` (searched from the newest)."""
        ops = self.cls.streams[stream]
        idx = next(i for i in range(len(ops) - 1, -1, -1) if ops[i].id == op_id)
        ops[idx] = replace(ops[idx], alloc=ops[idx].alloc + alloc, free=ops[idx].free + free)

    def last(self, stream: Stream) -> int | None:
        """Id of the newest op on `stream` (its completion = a CUDA event on that stream)."""
        ops = self.cls.streams.get(stream)
        return ops[-1].id if ops else None

    def resident(self, category: Mem, label: str, nbytes: float) -> None:
        if nbytes > 0:
            self.cls.resident.append(Alloc(category, label, nbytes))
