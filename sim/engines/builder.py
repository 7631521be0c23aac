"""Builds the schedule of one rank class, op by op, with CUDA's ordering rules made explicit.

Every op is added with a typed constructor and returns an `OpRef`, the token later ops name
in `deps`. Two more orderings are the host's and the streams', as in CUDA:

- `stream_wait(stream, ref)`: cudaStreamWaitEvent, the next op issued on `stream` waits for
  `ref` (e.g. the compute stream waits for a gradient bucket before going on);
  `stream_receive(stream, tag)`: the same for a pipeline send from a neighbouring stage.
- `host_sync(ref)`: the host blocks until `ref` has completed (cudaEventSynchronize), so
  every op it issues later, on any stream, waits for it. The newest sync per stream is kept
  (a later target on an in-order stream implies the earlier ones); the first op issued after
  a sync records it (`Op.synced`), which is where the host clock waits (sim.des.host).

Ops are drafts until `finish()`, so memory effects can be attached to an op already issued
(a parameter freed when a later op ends) without rebuilding it.

Identical micro-steps are planned once: a planner brackets each part of a micro-step
(its forward, its backward) with `begin_part` / `end_part(key, ms)`, and the builder keeps
the part as a template when it is self-contained (every dependency inside it, no stream
wait, receive or host sync left pending before or after it, no op before it changed). A
later part with the same key is then `replay`ed: the template's ops with the micro-step
renumbered and the dependencies shifted. The planner promises that parts with one key plan
the same ops (Planner.part_key); tests/unit/test_part_replay.py plans every strategy both
ways and compares them op by op.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Iterable
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
    Kernel,
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
    ready: AnyOp | None = None     # a replayed op, built at once (made a plain draft if changed)
    queue_after: OpRef | None = None   # a queued collective's predecessor in its group, if only the queue adds it


@dataclass(frozen=True, slots=True)
class _Template:
    """A recorded part: per op, its type and constructor arguments except the id, the
    micro-step, the dependencies (kept relative to the part's first op) and pipeline tags,
    and for the first collective of a queued process group in the part that group (on
    replay it queues behind the group's newest collective before the part); the last op of
    each stream it touched and of each group (relative too)."""

    ops: tuple[tuple[type[AnyOp], dict[str, Any], tuple[int, ...], Axis | None], ...]
    last: tuple[tuple[Stream, int], ...]
    group_last: tuple[tuple[Axis, int], ...] = ()


class Builder:
    """Appends ops to the streams of one class; ids are unique within the class."""

    def __init__(self, *, replay: bool = True) -> None:
        self.replays = replay
        self.joins = True        # join kernels of quiet uses (Builder.compute `join`)
        self.replayed = 0        # parts issued from a template (for tests and benchmarks)
        self._templates: dict[Hashable, _Template] = {}
        self._part_start: int | None = None
        self._part_clean = False
        self._drafts: list[_Draft] = []
        self._last: dict[Stream, OpRef] = {}
        self.queued_groups: frozenset[Axis] = frozenset()   # process groups whose collectives queue
        self._group_last: dict[Axis, OpRef] = {}            # the newest collective of each queued group
        self._stream_waits: dict[Stream, list[OpRef]] = {}
        self._receives: dict[Stream, list[PipeTag]] = {}
        self._host_gates: dict[Stream, OpRef] = {}   # the newest op the host synced on, per stream
        self._syncs: list[OpRef] = []                # syncs since the last op was issued
        self._referenced: set[int] = set()       # ops something waits for (never joined onto)
        self._joined: dict[int, list[str]] = {}   # op -> the names of the module ops joined into it
        self.resident_allocs: list[Alloc] = []
        self.host_allocs: list[Alloc] = []

    # -- ordering -------------------------------------------------------------------------------
    def stream_wait(self, stream: Stream, ref: OpRef | None) -> None:
        """The next op issued on `stream` waits for `ref` (cudaStreamWaitEvent)."""
        if ref is not None:
            self._referenced.add(ref)
            self._stream_waits.setdefault(stream, []).append(ref)

    def stream_receive(self, stream: Stream, tag: PipeTag) -> None:
        """The next op issued on `stream` waits for the pipeline send `tag`."""
        self._receives.setdefault(stream, []).append(tag)

    def host_sync(self, ref: OpRef | None) -> None:
        """The host waits for `ref`: every op issued later depends on it."""
        if ref is not None:
            self._referenced.add(ref)
            self._host_gates[self._drafts[ref].stream] = ref
            self._syncs.append(ref)

    # -- ops ------------------------------------------------------------------------------------
    def compute(self, name: str, phase: Phase, micro_step: int, *, kernels: tuple[Kernel, ...] = (),
                layer: int | None = None, deps: Deps = (), alloc: tuple[Alloc, ...] = (),
                free: tuple[Alloc, ...] = (), join: bool = False, hooks: int = 0, pieces: int = 0) -> OpRef:
        """A compute op running `kernels`; with `join`, they are appended to the previous op
        instead when nothing can tell the two apart (`_joinable`): the returned ref is then
        that op's."""
        if join and self.joins and not alloc and not hooks and not pieces and not any(d is not None for d in deps) and \
                self._joinable(phase, micro_step, layer):
            return self._join(name, kernels, free)
        return self._add(Compute, Stream.COMPUTE, deps, alloc, free, name=name, phase=phase, micro_step=micro_step,
                         layer=layer, kernels=kernels, hooks=hooks, pieces=pieces)

    def side_compute(self, stream: Stream, name: str, phase: Phase, micro_step: int, *,
                     kernels: tuple[Kernel, ...], layer: int | None = None, deps: Deps = ()) -> OpRef:
        """Kernels a framework launches on one of its side streams (DeepSpeed ZeRO++'s
        quantization on the reduction stream), ordered with that stream's collectives."""
        return self._add(Compute, stream, deps, (), (), name=name, phase=phase, micro_step=micro_step,
                         layer=layer, kernels=kernels, hooks=0, pieces=0)

    def _joinable(self, phase: Phase, micro_step: int, layer: int | None) -> bool:
        """The previous op may take one more kernel at its end when it is the last op issued,
        a compute op of the same module block, phase and micro-step, in the current part;
        nothing waits for it yet and it frees nothing (both would then happen later), and
        the new kernel would wait for nothing it does not already wait for."""
        ref = len(self._drafts) - 1
        if ref < 0 or ref in self._referenced or (self._part_start is not None and ref < self._part_start):
            return False
        prev = self._drafts[ref]
        f = prev.fields
        return (prev.ready is None and prev.cls is Compute and prev.stream is Stream.COMPUTE and not prev.free
                and f["phase"] is phase and f["micro_step"] == micro_step and f["layer"] == layer
                and not self._stream_waits.get(Stream.COMPUTE) and not self._receives.get(Stream.COMPUTE)
                and not self._syncs and all(g in f["deps"] for g in self._host_gates.values()))

    def _join(self, name: str, kernels: tuple[Kernel, ...], free: tuple[Alloc, ...]) -> OpRef:
        ref = len(self._drafts) - 1
        draft = self._drafts[ref]
        f = draft.fields
        f["kernels"] = f["kernels"] + kernels
        names = self._joined.setdefault(ref, [f["name"]])
        names.append(name)
        f["name"], f["joined"] = joined_name(names), tuple(names)
        draft.free.extend(free)
        return cast(OpRef, ref)

    def gpu_optimizer(self, name: str, micro_step: int, *, params: float, deps: Deps = (),
                      holds: tuple[Alloc, ...] = (), implementation: str = "fused", tensors: int = 1) -> OpRef:
        """Adam on the GPU; `holds` are buffers alive while it runs."""
        return self._add(GpuOptimizer, Stream.COMPUTE, deps, holds, holds, name=name, phase=Phase.STEP,
                         micro_step=micro_step, params=params, implementation=implementation, tensors=tensors)

    def cpu_step(self, name: str, micro_step: int, *, params: float, deps: Deps = (),
                 host_bytes: float = 0.0) -> OpRef:
        return self._add(CpuStep, Stream.CPU, deps, (), (), name=name, phase=Phase.STEP, micro_step=micro_step,
                         params=params, host_bytes=host_bytes)

    def collective(self, stream: Stream, coll: Coll, nbytes: float, name: str, phase: Phase, micro_step: int, *,
                   axis: Axis = Axis.DP, layer: int | None = None, deps: Deps = (),
                   alloc: tuple[Alloc, ...] = (), free: tuple[Alloc, ...] = (), purpose: str = "",
                   pieces: int = 0) -> OpRef:
        own = list(deps)
        queued = axis in self.queued_groups
        before = self._group_last.get(axis) if queued else None
        ref = self._add(Collective, stream, [*own, before], alloc, free, name=name, phase=phase,
                        micro_step=micro_step, layer=layer, purpose=purpose, coll=coll, axis=axis, nbytes=nbytes,
                        pieces=pieces)
        if queued:
            self._drafts[ref].queue_after = before if before not in own else None
            self._group_last[axis] = ref
        return ref

    def send(self, name: str, phase: Phase, micro_step: int, *, nbytes: float, tag: PipeTag, peer: int,
             deps: Deps = ()) -> OpRef:
        return self._add(Send, Stream.P2P, deps, (), (), name=name, phase=phase, micro_step=micro_step,
                         purpose="pipeline", nbytes=nbytes, tag=tag, peer=peer)

    def copy(self, direction: Stream, nbytes: float, name: str, phase: Phase, micro_step: int, *,
             stream: Stream | None = None, layer: int | None = None, deps: Deps = (), pageable: bool = False,
             fresh: bool = False) -> OpRef:
        """A PCIe copy in `direction`, on its own copy stream unless the engine issues it on
        `stream`; `fresh`: a D2H into a pageable tensor the copy allocates (Copy.fresh)."""
        assert not fresh or (pageable and direction is Stream.D2H), "fresh is a pageable D2H"
        return self._add(Copy, stream or direction, deps, (), (), name=name, phase=phase, micro_step=micro_step,
                         layer=layer, nbytes=nbytes, direction=direction, pageable=pageable, fresh=fresh)

    def _add(self, cls: type[AnyOp], stream: Stream, deps: Deps, alloc: tuple[Alloc, ...],
             free: tuple[Alloc, ...], **fields: Any) -> OpRef:
        ref = cast(OpRef, len(self._drafts))
        wanted = {d for d in deps if d is not None}
        self._referenced.update(wanted)
        waits = self._stream_waits.pop(stream, None)
        if waits:
            wanted.update(waits)
        if self._host_gates:
            wanted.update(self._host_gates.values())
        if self._syncs:
            fields["synced"] = tuple(self._syncs)
            self._syncs = []
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
        if self._part_start is not None and ref < self._part_start:
            self._part_clean = False      # the part changes an op before it: not a template
        self._referenced.add(ref)
        draft = self._drafts[ref]
        if draft.ready is not None:
            op, draft.ready = draft.ready, None
            draft.fields = {f.name: getattr(op, f.name) for f in dataclasses.fields(op)
                            if f.name not in ("id", "stream", "alloc", "free")}
            draft.alloc, draft.free = list(op.alloc), list(op.free)
        draft.alloc.extend(alloc)
        draft.free.extend(free)

    def resident(self, category: Mem, label: str, nbytes: float) -> None:
        if nbytes > 0:
            self.resident_allocs.append(Alloc(category, label, nbytes))

    # -- identical parts ------------------------------------------------------------------------
    def _settled(self) -> bool:
        return not any(self._stream_waits.values()) and not any(self._receives.values()) and not self._host_gates

    def begin_part(self) -> None:
        """The ops issued from now to `end_part` are one part of a micro-step."""
        self._part_start = len(self._drafts)
        self._part_clean = self._settled()

    def end_part(self, key: Hashable, micro_step: int) -> None:
        """Keep the part as the template of `key` if it is self-contained."""
        start, self._part_start = self._part_start, None
        if start is None or not self.replays or key in self._templates or not (self._part_clean and self._settled()):
            return
        ops = []
        seen: set[Axis] = set()   # queued groups with a collective earlier in the part
        for d in self._drafts[start:]:
            if d.ready is not None:
                return                # a part made of replayed ops: its own template is kept
            fields = dict(d.fields)
            deps = fields.pop("deps")
            queued = d.cls is Collective and fields["axis"] in self.queued_groups
            group = fields["axis"] if queued and fields["axis"] not in seen else None
            if queued:
                seen.add(fields["axis"])
            if group is not None:     # its queue predecessor comes from before the part
                deps = tuple(dep for dep in deps if dep != d.queue_after)
            tags = [*fields.get("waits_for", ()), *([fields["tag"]] if "tag" in fields else [])]
            if any(dep < start for dep in deps) or fields["micro_step"] != micro_step or \
                    any(tag.micro_step != micro_step for tag in tags):
                return
            fields.update(stream=d.stream, alloc=tuple(d.alloc), free=tuple(d.free))
            ops.append((d.cls, fields, tuple(dep - start for dep in deps), group))
        last = tuple((stream, ref - start) for stream, ref in self._last.items() if ref >= start)
        group_last = tuple((axis, ref - start) for axis, ref in self._group_last.items() if ref >= start)
        self._templates[key] = _Template(tuple(ops), last, group_last)

    def replay(self, key: Hashable, micro_step: int) -> bool:
        """Issue the template of `key` again for `micro_step`; False when there is none (or
        ops are pending that the template did not see): then the planner plans the part."""
        template = self._templates.get(key) if self.replays else None
        if template is None or not self._settled():
            return False
        base = len(self._drafts)
        append = self._drafts.append
        before = self._group_last      # updated only after the part's ops are issued
        for i, (cls, args, deps, group) in enumerate(template.ops):
            kw = dict(args)
            kw["id"], kw["micro_step"] = base + i, micro_step
            shifted = [base + d for d in deps]
            if group is not None and before.get(group) is not None:
                shifted.append(before[group])
            if shifted:
                kw["deps"] = tuple(sorted(shifted))
            if "waits_for" in kw:
                kw["waits_for"] = tuple(dataclasses.replace(t, micro_step=micro_step) for t in kw["waits_for"])
            if "tag" in kw:
                kw["tag"] = dataclasses.replace(kw["tag"], micro_step=micro_step)
            op = cls(**kw)
            append(_Draft(cls, op.stream, {}, ready=op))
        for stream, ref in template.last:
            self._last[stream] = cast(OpRef, base + ref)
        for axis, ref in template.group_last:
            self._group_last[axis] = cast(OpRef, base + ref)
        self.replayed += 1
        return True

    # -- reading back -----------------------------------------------------------------------------
    def last(self, stream: Stream) -> OpRef | None:
        """The newest op on `stream` (its completion = a CUDA event recorded on that stream)."""
        return self._last.get(stream)

    def finish(self) -> ClassSchedule:
        """The class schedule: every draft made an immutable, typed op."""
        cls = ClassSchedule(resident=list(self.resident_allocs), host=list(self.host_allocs))
        streams = cls.streams
        for i, d in enumerate(self._drafts):
            op = d.ready
            if op is None:
                op = d.cls(id=i, stream=d.stream, alloc=tuple(d.alloc), free=tuple(d.free), **d.fields)
            ops = streams.get(d.stream)
            if ops is None:
                ops = streams[d.stream] = []
            ops.append(op)
        return cls


def joined_name(names: list[str]) -> str:
    """The name of an op joining kernels: their verb ('fwd', 'bwd' for bwd-input and
    bwd-weight) and the longest module path they share, e.g. 'fwd model.layers.18'."""
    verbs = [n.split(" ", 1)[0] for n in names]
    paths = [n.split(" ", 1)[1].split(".") if " " in n else [] for n in names]
    verb = verbs[0] if len(set(verbs)) == 1 else verbs[0].split("-")[0]
    common: list[str] = []
    for parts in zip(*paths):
        if len(set(parts)) > 1:
            break
        common.append(parts[0])
    return f"{verb} {'.'.join(common)}" if common else f"{names[0]} .. {names[-1]}"
