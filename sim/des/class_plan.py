"""What the engine precomputes once per rank class, so that executing an op costs little.

- `duration`: an op's time when it shares no link (sim.analytic.opcost), or when its links
  are always its own (sim.des.transfers), else None.
- `awaited`: the ops another op depends on; only these get a SimPy event.
- `follows`: ops that start exactly when their stream predecessor ends, whatever the other
  streams do, so the engine runs them in the same SimPy step as it: the op needs no link,
  no pipeline receive, and every one of its dependencies is already implied by its stream
  order (a static transitive reduction: a dependency on stream X is implied once an
  earlier op of this stream, or one of the ops it waited for, waited for the same or a later
  op of X); the predecessor needs no link either, is awaited by nobody and frees nothing,
  and the op allocates nothing, so no other process can observe the boundary between them.
  The times are the same sums as one op after the other (tests/crosscheck).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar, cast

from sim.des.transfers import LINK_OPS
from sim.engines.schedule import AnyOp, ClassSchedule, Compute, CpuStep, GpuOptimizer
from sim.inputs.scenario import Scenario

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ClassPlan:
    duration: dict[int, float | None]
    awaited: frozenset[int]
    follows: frozenset[int]

    @staticmethod
    def of(cls: ClassSchedule, s: Scenario, *, local_time: Callable[[AnyOp, Scenario], float | None],
           fuse: bool = True, link_times: dict[int, float] | None = None) -> ClassPlan:
        """`link_times`: closed-form times of link-using ops known to have their links to
        themselves (sim.des.transfers.exclusive_times); the others get None."""
        ops = list(cls.ops())
        known: dict[tuple[object, ...], float | None] = {}   # identical blocks: identical costs
        by_kernels: dict[int, float | None] = {}   # replayed ops share their kernel tuple (alive here)
        duration: dict[int, float | None] = {}
        for op in ops:
            if type(op) in LINK_OPS:      # their time depends on what shares their links
                duration[op.id] = None
                continue
            if type(op) is Compute:
                seconds = by_kernels.get(id(op.kernels), -1.0)
                if seconds == -1.0:
                    key = _cost_key(op)
                    if key not in known:
                        known[key] = local_time(op, s)
                    seconds = by_kernels[id(op.kernels)] = known[key]
                duration[op.id] = seconds
                continue
            key = _cost_key(op)
            if key not in known:
                known[key] = local_time(op, s)
            duration[op.id] = known[key]
        for op_id, seconds in (link_times or {}).items():
            duration[op_id] = seconds
        awaited = _derived(cls, "awaited", lambda: frozenset(d for op in ops for d in op.deps))
        follows = _follows(cls, duration, awaited) if fuse else frozenset()
        return ClassPlan(duration, awaited, follows)


def _cost_key(op: AnyOp) -> tuple[object, ...]:
    """What an op's isolated duration depends on (the op's type and its work), or the op
    itself for ops that use links (they have no isolated duration here)."""
    if isinstance(op, Compute):
        return (Compute, op.kernels)
    if isinstance(op, GpuOptimizer):
        return (type(op), op.params, op.implementation, op.tensors)
    if isinstance(op, CpuStep):
        return (type(op), op.params, op.host_bytes)
    return (type(op), op.id)


def _derived(cls: ClassSchedule, name: str, compute: Callable[[], T]) -> T:
    """`compute()` for this schedule, kept in `cls.derived` while its streams keep their
    shape: a fit or a sweep simulates one planned schedule hundreds of times, and what
    depends on the ops alone (not on their durations) is the same every time (about a tenth
    of a fit's time went to `implied_deps`, 2026-12-08)."""
    shape = cls.shape()
    kept = cls.derived.get(name)
    if kept is not None and kept[0] == shape:
        return cast(T, kept[1])
    value = compute()
    cls.derived[name] = (shape, value)
    return value


def _follows(cls: ClassSchedule, duration: dict[int, float | None], awaited: frozenset[int]) -> frozenset[int]:
    implied = _derived(cls, "implied", lambda: implied_deps(cls))
    out = set()
    for stream_ops in cls.streams.values():
        for prev, op in zip(stream_ops, stream_ops[1:]):
            if (implied[op.id] and not op.waits_for and not op.alloc and duration[op.id] is not None
                    and duration[prev.id] is not None and prev.id not in awaited and not prev.free):
                out.add(op.id)
    return frozenset(out)


def implied_deps(cls: ClassSchedule) -> dict[int, bool]:
    """op id -> whether all its dependencies are implied by its stream order (see above).
    For each op, `known` holds, per stream, the furthest position known to have ended when
    the op ends (its stream predecessor's knowledge, its dependencies', and itself). An op's
    own stream entry is implied by its position, so an op without dependencies shares its
    predecessor's list instead of copying it (most ops: compute chains)."""
    streams = list(cls.streams)
    stream_of: dict[int, int] = {}
    position: dict[int, int] = {}
    previous: dict[int, int | None] = {}
    by_id: dict[int, AnyOp] = {}
    for index, stream_ops in enumerate(cls.streams.values()):
        prev = None
        for i, op in enumerate(stream_ops):
            stream_of[op.id], position[op.id], previous[op.id], by_id[op.id] = index, i, prev, op
            prev = op.id
    nothing = [-1] * len(streams)
    known: dict[int, list[int]] = {}
    out: dict[int, bool] = {}
    for op_id in sorted(by_id):      # a dependency always has a smaller id
        op, prev = by_id[op_id], previous[op_id]
        base = known[prev] if prev is not None else nothing
        if not op.deps:
            known[op_id], out[op_id] = base, True
            continue
        own = stream_of[op_id]
        done = base
        implied = True
        for dep in op.deps:
            where, at = stream_of[dep], position[dep]
            reached = position[op_id] - 1 if where == own else done[where]
            if reached >= at:
                continue
            implied = False
            done = [a if a >= b else b for a, b in zip(done, known[dep])]
            if done[where] < at:
                done[where] = at
        known[op_id], out[op_id] = done, implied
    return out


def check_dependency_order(ops: list[AnyOp]) -> None:
    """The planners give every op a larger id than its dependencies (issue order)."""
    for op in ops:
        assert all(d < op.id for d in op.deps), op
