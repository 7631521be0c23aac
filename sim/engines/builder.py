"""Builds the schedule of one rank class, op by op, with CUDA's ordering rules made explicit.

Every op is added with a typed constructor and returns an `OpRef`, the token later ops name
in `deps`. Two more orderings are the host's and the streams', as in CUDA:

- `stream_wait(stream, ref)`: cudaStreamWaitEvent, the next op issued on `stream` waits for
  `ref` (e.g. the compute stream waits for a gradient bucket before going on);
  `stream_receive(stream, tag)`: the same for a pipeline send from a neighbouring stage.
- `host_sync(ref)`: the host blocks until `ref` has completed (cudaEventSynchronize), so
  every op it issues later, on any stream, waits for it. Only the newest sync is kept:
  sync targets lie on in-order streams, so a later target implies the earlier ones.

Ops are drafts until `finish()`, so memory effects can be attached to an op already issued
(a parameter freed when a later op ends) without rebuilding it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from sim.core.enums import Axis, Coll
from sim.engines.schedule import (
    Alloc,
    AnyOp,
    ClassSchedule,
    Collective,
    Compute,
    Copy,
    CpuStep,
    GpuOptimizer,
    Mem,
    OpRef,
    Phase,
    PipeTag,
    Send,
    Stream,
)

Deps = Iterable[OpRef | None]


@dataclass(slots=True)
class _Draft:
    cls: type[AnyOp]
    stream: Stream
    fields: dict[str, Any]
    alloc: list[Alloc] = field(default_factory=list)
    free: list[Alloc] = field(default_factory=list)


class Builder:
    """Appends ops to the streams of one class; ids are unique within the class."""

    def __init__(self) -> None:
        self._drafts: list[_Draft] = []
        self._last: dict[Stream, OpRef] = {}
        self._stream_waits: dict[Stream, list[OpRef]] = {}
        self._receives: dict[Stream, list[PipeTag]] = {}
        self._host_gate: OpRef | None = None
        self.resident_allocs: list[Alloc] = []
        self.host_allocs: list[Alloc] = []

    # -- ordering -------------------------------------------------------------------------------
    def stream_wait(self, stream: Stream, ref: OpRef | None) -> None:
        """The next op issued on `stream` waits for `ref` (cudaStreamWaitEvent)."""
        if ref is not None:
            self._stream_waits.setdefault(stream, []).append(ref)

    def stream_receive(self, stream: Stream, tag: PipeTag) -> None:
        """The next op issued on `stream` waits for the pipeline send `tag`."""
        self._receives.setdefault(stream, []).append(tag)

    def host_sync(self, ref: OpRef | None) -> None:
        """The host waits for `ref`: every op issued later depends on it."""
        if ref is not None:
            self._host_gate = ref

    # -- ops ------------------------------------------------------------------------------------
    def compute(self, name: str, phase: Phase, micro_step: int, *, flops: float = 0.0, mem_bytes: float = 0.0,
                elementwise_bytes: float = 0.0, layer: int | None = None, deps: Deps = (),
                alloc: tuple[Alloc, ...] = (), free: tuple[Alloc, ...] = ()) -> OpRef:
        return self._add(Compute, Stream.COMPUTE, deps, alloc, free, name=name, phase=phase, micro_step=micro_step,
                         layer=layer, flops=flops, mem_bytes=mem_bytes, elementwise_bytes=elementwise_bytes)

    def gpu_optimizer(self, name: str, micro_step: int, *, params: float, deps: Deps = (),
                      holds: tuple[Alloc, ...] = ()) -> OpRef:
        """Adam on the GPU; `holds` are buffers alive while it runs."""
        return self._add(GpuOptimizer, Stream.COMPUTE, deps, holds, holds, name=name, phase=Phase.STEP,
                         micro_step=micro_step, params=params)

    def cpu_step(self, name: str, micro_step: int, *, params: float, deps: Deps = ()) -> OpRef:
        return self._add(CpuStep, Stream.CPU, deps, (), (), name=name, phase=Phase.STEP, micro_step=micro_step,
                         params=params)

    def collective(self, stream: Stream, coll: Coll, nbytes: float, name: str, phase: Phase, micro_step: int, *,
                   axis: Axis = Axis.DP, layer: int | None = None, deps: Deps = (),
                   alloc: tuple[Alloc, ...] = (), free: tuple[Alloc, ...] = (), purpose: str = "") -> OpRef:
        return self._add(Collective, stream, deps, alloc, free, name=name, phase=phase, micro_step=micro_step,
                         layer=layer, purpose=purpose, coll=coll, axis=axis, nbytes=nbytes)

    def send(self, name: str, phase: Phase, micro_step: int, *, nbytes: float, tag: PipeTag, peer: int,
             deps: Deps = ()) -> OpRef:
        return self._add(Send, Stream.P2P, deps, (), (), name=name, phase=phase, micro_step=micro_step,
                         purpose="pipeline", nbytes=nbytes, tag=tag, peer=peer)

    def copy(self, direction: Stream, nbytes: float, name: str, phase: Phase, micro_step: int, *,
             stream: Stream | None = None, layer: int | None = None, deps: Deps = ()) -> OpRef:
        """A PCIe copy in `direction`, on its own copy stream unless the engine issues it on `stream`."""
        return self._add(Copy, stream or direction, deps, (), (), name=name, phase=phase, micro_step=micro_step,
                         layer=layer, nbytes=nbytes, direction=direction)

    def _add(self, cls: type[AnyOp], stream: Stream, deps: Deps, alloc: tuple[Alloc, ...],
             free: tuple[Alloc, ...], **fields: Any) -> OpRef:
        ref = cast(OpRef, len(self._drafts))
        wanted = {d for d in deps if d is not None}
        waits = self._stream_waits.pop(stream, None)
        if waits:
            wanted.update(waits)
        if self._host_gate is not None:
            wanted.add(self._host_gate)
        fields["deps"] = tuple(sorted(wanted)) if len(wanted) > 1 else tuple(wanted)
        if self._receives:
            receives = self._receives.pop(stream, None)
            if receives:
                fields["waits_for"] = tuple(receives)
        self._drafts.append(_Draft(cls, stream, fields, list(alloc), list(free)))
        self._last[stream] = ref
        return ref

    # -- memory ---------------------------------------------------------------------------------
    def attach(self, ref: OpRef | None, *, alloc: tuple[Alloc, ...] = (), free: tuple[Alloc, ...] = ()) -> None:
        """Memory taken / given back by an op already issued."""
        if ref is None:
            return
        draft = self._drafts[ref]
        draft.alloc.extend(alloc)
        draft.free.extend(free)

    def resident(self, category: Mem, label: str, nbytes: float) -> None:
        if nbytes > 0:
            self.resident_allocs.append(Alloc(category, label, nbytes))

    # -- reading back -----------------------------------------------------------------------------
    def last(self, stream: Stream) -> OpRef | None:
        """The newest op on `stream` (its completion = a CUDA event recorded on that stream)."""
        return self._last.get(stream)

    def finish(self) -> ClassSchedule:
        """The class schedule: every draft made an immutable, typed op."""
        cls = ClassSchedule(resident=list(self.resident_allocs), host=list(self.host_allocs))
        for i, d in enumerate(self._drafts):
            op = d.cls(id=i, stream=d.stream, alloc=tuple(d.alloc), free=tuple(d.free), **d.fields)
            cls.streams.setdefault(d.stream, []).append(op)
        return cls
