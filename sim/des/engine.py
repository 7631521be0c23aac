"""The discrete-event engine: ranks with CUDA-like streams, shared links, memory pools.

Each simulated rank runs one SimPy process per stream, walking that stream's ops in order
(CUDA stream semantics); an op starts when the previous op of its stream has ended and
every dependency (an event on another stream) has fired. Collectives meet at a rendezvous
(full mode: every member rank is simulated) or run for the representative rank alone
(representative mode: one rank per class stands for all its symmetric peers; its links
carry the same flows, so both modes give the same times on symmetric layouts).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import simpy

from sim.analytic import opcost
from sim.analytic.kernel_time import kernel_time as kernel_seconds
from sim.core.perf import paused_gc
from sim.des.class_plan import ClassPlan
from sim.des.host import HostClock, HostPlan, fold_synchronous
from sim.des.host_resources import host_key, host_links, shared_links
from sim.des.interference import Interference
from sim.des.memory_pool import MemoryPool
from sim.des.network import FlowNetwork
from sim.des.transfers import (
    Transfer,
    alone_time,
    collective_transfers,
    copy_transfers,
    exclusive_times,
    send_transfers,
)
from sim.engines.layout import Layout
from sim.engines.schedule import (
    AnyOp,
    ClassSchedule,
    Collective,
    Compute,
    Copy,
    CpuStep,
    GpuOptimizer,
    Kernel,
    PipeTag,
    Schedule,
    Send,
    Stream,
)
from sim.inputs.scenario import Scenario


def local_time(op: AnyOp, s: Scenario, timer: Callable[[Kernel], float] | None = None) -> float | None:
    """Duration of an op that shares no link (sim.analytic.kernel_time, opcost), None for
    the others; `timer` times a kernel (default: kernel_time)."""
    if isinstance(op, Compute):
        time = timer or (lambda k: kernel_time(k, s))
        return sum(time(k) for k in op.kernels)
    if isinstance(op, GpuOptimizer):
        return opcost.gpu_adam_time(op.params, s.cluster, op.implementation, op.tensors)
    if not isinstance(op, CpuStep):
        return None
    return opcost.device_op_time(op.kind.value, flops=0.0, mem_bytes=0.0, elementwise_bytes=0.0,
                                 params=op.params, precision=s.training.precision.value, cluster=s.cluster,
                                 ranks_per_node=s.gpus_per_node, host_bytes=op.host_bytes)


def kernel_time(k: Kernel, s: Scenario) -> float:
    """One kernel's time on the scenario's GPU."""
    return kernel_seconds(k, s.cluster.gpu, s.training.precision.value)


def kernel_timer(s: Scenario) -> Callable[[Kernel], float]:
    """kernel_time for one run, remembered per kernel object (identical blocks share theirs)."""
    known: dict[int, tuple[Kernel, float]] = {}

    def timed(k: Kernel) -> float:
        hit = known.get(id(k))
        if hit is None:
            hit = known[id(k)] = (k, kernel_time(k, s))     # holds k, so its id stays its own
        return hit[1]
    return timed


@dataclass(slots=True)
class SendSlot:
    """A pipeline send met by its receiver: created by whichever side comes first."""

    arrived: simpy.Event
    op: Send | None = None
    time: float = 0.0


class Mode(StrEnum):
    REPRESENTATIVE = "representative"
    FULL = "full"


def events_scheduled(env: simpy.Environment) -> int:
    """How many events `env` has scheduled so far (for the benchmark): SimPy numbers every
    event it queues from one counter (simpy/core.py `Environment.schedule`); reading it
    takes one number, which is harmless. Counting in an overridden `step` would cost a
    Python call per event."""
    counter: Iterator[int] = getattr(env, "_eid")
    return next(counter)


@dataclass(slots=True)
class Span:
    """One executed op: when it was ready, when it started and ended, what held it up."""

    rank: int
    step: int
    op: AnyOp
    ready: float
    start: float
    end: float
    blocker: AnyOp | None     # the dependency that ended last, when the op had to wait for it
    host_wait: float = 0.0    # of the wait before it, the part the host took to issue it (sim.des.host)
    host_inside: float = 0.0  # of its duration, the part its kernels waited for their launches
    host_begun: float = -1.0  # when the host began issuing it (-1: no host model)


@dataclass(slots=True)
class Meeting:
    """Full mode: the members of a group that have reached a collective so far."""

    done: simpy.Event
    arrived: int = 0


@dataclass
class EventEngine:
    scenario: Scenario
    schedule: Schedule
    layout: Layout
    mode: Mode = Mode.REPRESENTATIVE
    serial: bool = False        # run every op of a rank one at a time, in issue order
    shortcuts: bool = True      # fused op chains and closed-form exclusive links (same times; tests)
    host: bool = True           # the host issues every op and pays its CPU costs (sim.des.host)
    env: simpy.Environment = field(default_factory=simpy.Environment)
    spans: list[Span] = field(default_factory=list)
    step_bounds: list[tuple[float, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        world = self.layout.world_size
        self.ranks = list(self.layout.representatives) if self.mode is Mode.REPRESENTATIVE else list(range(world))
        cluster = self.scenario.cluster
        capacity: dict[Any, float] = {}
        for r in self.ranks:
            for link in opcost.LinkClass:
                capacity[(r, link)] = opcost.link_capacity(link, cluster)
            capacity.update(host_links(r, full=self.mode is Mode.FULL, s=self.scenario, layout=self.layout))
        self.network = FlowNetwork(self.env, capacity)
        self.pools = {r: MemoryPool(r, cluster.gpu.memory) for r in self.ranks}
        self._class = {r: self.layout.class_of(r) for r in self.ranks}
        self._meetings: dict[tuple[int, int, int], Meeting] = {}        # (step, op, first member)
        self._sends: dict[tuple[int, PipeTag, int], SendSlot] = {}     # (step, tag, receiver)
        self._collectives: dict[tuple[object, ...], list[Transfer]] = {}
        self.kernel_time = kernel_timer(self.scenario)
        self.interference = cluster.gpu.comm_interference if not self.serial else 0.0
        self.overlap = Interference(self.ranks, self.interference)   # what communication takes from compute
        self._alone: dict[tuple[object, ...], float] = {}    # a flow-network op's time alone (its earliest end)
        self._hosts = [HostPlan.of(cls.ops(), cluster.host, self.scenario.engine, self.kernel_time)
                       for cls in self.schedule.classes]
        # a CPU process pays its host costs inline (fold_synchronous); a GPU's host issues ahead (HostClock)
        self._inline_host = self.host and cluster.host.synchronous and not self.serial

    # -- the host side a node's ranks share (sim.des.host_resources) ------------------------
    def _host_key(self, rank: int, kind: Stream) -> Any:
        return host_key(rank, kind, full=self.mode is Mode.FULL, s=self.scenario, layout=self.layout)

    def _cpu_step(self, rank: int, op: CpuStep) -> Generator[simpy.Event, Any, None]:
        """Full mode: CPU-Adam and host casts as work on the node's CPU, shared by the ranks
        of the node that step at the same time (opcost.cpu_adam_time at the node's rates)."""
        work = opcost.cpu_adam_time(op.params, self.scenario.cluster, 1, op.host_bytes)
        yield self.network.transfer(work, ((self._host_key(rank, Stream.CPU), 1.0),))

    # -- running ---------------------------------------------------------------------------
    def run(self, steps: int = 1) -> None:
        """Simulate `steps` optimizer steps back to back; `spans` holds the last one's ops,
        `step_bounds` every step's start and end."""
        for r in self.ranks:
            for alloc in self.schedule.classes[self.layout.class_of(r)].resident:
                self.pools[r].allocate(alloc, 0.0)
        timed = self.kernel_time
        shared_cpu = self.mode is Mode.FULL      # CPU steps share the node's CPU (_cpu_step)

        def own_time(op: AnyOp, s: Scenario) -> float | None:
            return None if shared_cpu and isinstance(op, CpuStep) else local_time(op, s, timed)
        plans = [ClassPlan.of(cls, self.scenario, local_time=own_time,
                              fuse=self.shortcuts and not self.serial,
                              link_times=self._exclusive_times(k, cls) if self.shortcuts else {})
                 for k, cls in enumerate(self.schedule.classes)]
        if self._inline_host:
            for k, cls in enumerate(self.schedule.classes):
                fold_synchronous(cls.ops(), plans[k].duration, self.scenario.cluster.host, self.scenario.engine)
        with paused_gc():
            self._run_steps(steps, plans)

    def _run_steps(self, steps: int, plans: list[ClassPlan]) -> None:
        for step in range(steps):
            self.spans.clear()     # only the last step's records are kept: memory bounded by one step
            start = self.env.now
            procs = []
            for r in self.ranks:
                cls = self.schedule.classes[self.layout.class_of(r)]
                plan = plans[self.layout.class_of(r)]
                done = {op_id: self.env.event() for op_id in plan.awaited}
                ends: dict[int, float] = {}
                host = self._hosts[self.layout.class_of(r)]
                issues_ahead = self.host and host.busy and not self.serial and not self._inline_host
                clock = HostClock(host, start, ends) if issues_ahead else None
                lanes = [sorted(cls.ops(), key=lambda o: o.id)] if self.serial else list(cls.streams.values())
                for ops in lanes:
                    procs.append(self.env.process(self._stream(r, step, ops, plan, done, ends, clock)))
            self.env.run(until=self.env.all_of(procs))
            self.step_bounds.append((start, self.env.now))

    def _stream(self, rank: int, step: int, ops: list[AnyOp], plan: ClassPlan, done: dict[int, simpy.Event],
                ends: dict[int, float], clock: HostClock | None) -> Generator[simpy.Event, Any, None]:
        """One stream of one rank, op after op. An op whose dependencies have all ended
        starts without a SimPy event, only ops that others wait for get one, and ops that
        follow their predecessor unconditionally (ClassPlan.follows) run in its step. No op
        starts before the host has issued it (`clock`)."""
        pool, env, spans, duration, follows = self.pools[rank], self.env, self.spans, plan.duration, plan.follows
        lead, tail = (clock.plan.lead, clock.plan.tail) if clock is not None else ([], [])
        i, n = 0, len(ops)
        while i < n:
            op = ops[i]
            ready = env.now
            if op.deps:
                waiting = [done[d] for d in op.deps if d not in ends]
                if len(waiting) == 1:
                    yield waiting[0]
                elif waiting:
                    yield env.all_of(waiting)
            blocker: AnyOp | None = None
            if op.waits_for:
                local_end = env.now
                for tag in op.waits_for:     # a pipeline send from the neighbouring stage
                    yield self._send_slot(step, tag, rank).arrived
                if env.now > local_end:
                    slot = max((self._send_slot(step, t, rank) for t in op.waits_for),
                               key=lambda slot: (slot.time, slot.op.id if slot.op else -1))
                    blocker = slot.op
            start = env.now
            if blocker is None and start > ready:
                blocker = self._op(rank, max(op.deps, key=lambda d: (ends[d], d)))
            host_wait = inside = begun = 0.0
            if clock is not None:
                begun = clock.begins(op.id)
                issued = begun + lead[op.id]
                if issued > start:
                    host_wait = issued - start
                    yield env.timeout(host_wait)
                    start = env.now
            for alloc in op.alloc:
                pool.allocate(alloc, start)
            alone = duration[op.id]
            if alone is None:
                yield from self._execute(rank, step, op)
                end = env.now
            elif i + 1 < n and ops[i + 1].id in follows:
                seg_start, work = start, self._begin(rank, op, start, alone)
                idle = [] if work else [(start, start + alone)]   # the run's ops that are not GPU kernels
                end = start + alone
                if clock is not None and begun + tail[op.id] > end:
                    inside, end = begun + tail[op.id] - end, begun + tail[op.id]
                while i + 1 < n and ops[i + 1].id in follows:   # runs on without a SimPy step
                    spans.append(Span(rank, step, op, ready, start, end, blocker, host_wait, inside,
                                      begun if clock is not None else -1.0))
                    ends[op.id] = end
                    i += 1
                    op, ready, start, blocker, host_wait, inside = ops[i], end, end, None, 0.0, 0.0
                    next_time = duration[op.id]
                    assert next_time is not None      # `follows` only holds ops with a duration
                    if clock is not None:
                        begun = clock.begins(op.id)
                        if begun + lead[op.id] > start:
                            start, host_wait = begun + lead[op.id], begun + lead[op.id] - start
                    kernels = self._begin(rank, op, start, next_time, joined=True)
                    work += kernels
                    if not kernels:
                        idle.append((start, start + next_time))
                    end = start + next_time
                    if clock is not None and begun + tail[op.id] > end:
                        inside, end = begun + tail[op.id] - end, begun + tail[op.id]
                yield env.timeout(end - env.now)
                if work:
                    yield from self._interfered(rank, op.stream, seg_start, work, idle)
                end = env.now
            else:
                work = self._begin(rank, op, start, alone)
                end = start + alone
                if clock is not None and begun + tail[op.id] > end:
                    inside, end = begun + tail[op.id] - end, begun + tail[op.id]
                yield env.timeout(end - env.now)
                if work:
                    yield from self._interfered(rank, op.stream, start, work)
                end = env.now
            for alloc in op.free:
                pool.free(alloc, end)
            ends[op.id] = end
            spans.append(Span(rank, step, op, ready, start, end, blocker, host_wait, inside,
                              begun if clock is not None else -1.0))
            event = done.get(op.id)
            if event is not None:
                event.succeed()
            i += 1

    def _begin(self, rank: int, op: AnyOp, start: float, seconds: float, joined: bool = False) -> float:
        """An op with a time of its own begins at `start`: a collective or send timed in closed
        form is recorded as in flight until it ends; GPU kernels (compute, the optimizer's)
        return the work they bring for `_interfered` to account (0 without interference, or
        for any other op). An op `joined` to a run already begun keeps the intervals since
        the run's start."""
        if not self.interference:
            return 0.0
        if isinstance(op, (Collective, Send)):
            self.overlap.timed(rank, start, start + seconds)
            return 0.0
        if not isinstance(op, (Compute, GpuOptimizer)):
            return 0.0
        if not joined:
            self.overlap.began(rank, op.stream, start)
        return seconds

    def _interfered(self, rank: int, stream: Stream, start: float, work: float,
                    idle: list[tuple[float, float]] | None = None) -> Generator[simpy.Event, Any, None]:
        """GPU kernels that began at `start` with `work` seconds to do go on until the work that
        communication beside them took is made up (sim.des.interference). `idle`: windows of
        the run taken by ops that are not kernels (a TP all-reduce or a ZeRO-3 fetch joined
        to the compute stream), neither work nor slowed."""
        left = self.overlap.shortfall(rank, start, self.env.now, work, idle or ())
        while left:
            yield self.env.timeout(self.overlap.step(rank, self.env.now, left))
            left = self.overlap.shortfall(rank, start, self.env.now, work, idle or ())
        self.overlap.ended(rank, stream)

    def _send_slot(self, step: int, tag: PipeTag, receiver: int) -> SendSlot:
        key = (step, tag, receiver)
        slot = self._sends.get(key)
        if slot is None:
            slot = self._sends[key] = SendSlot(self.env.event())
        return slot

    def _send(self, rank: int, step: int, op: Send) -> Generator[simpy.Event, Any, None]:
        """A pipeline send: the activation (or its gradient) crosses to the neighbouring stage."""
        yield from self._transfer(send_transfers(op, rank, self.layout, self.scenario))
        c = self.layout.coords(rank)
        receiver = self.layout.rank(type(c)(c.dp, (c.pp + op.peer) % self.layout.pp, c.tp))
        slot = self._send_slot(step, op.tag, receiver)
        slot.op, slot.time = op, self.env.now
        slot.arrived.succeed()

    def _transfer(self, transfers: list[Transfer]) -> Generator[simpy.Event, Any, None]:
        for t in transfers:
            yield self.env.timeout(t.latency)
            yield self.network.transfer(t.nbytes, shared_links(t.links, full=self.mode is Mode.FULL,
                                                               s=self.scenario, layout=self.layout), t.rate)

    def _exclusive_times(self, k: int, cls: ClassSchedule) -> dict[int, float]:
        """Representative mode: closed-form times of the ops that always have their links to
        themselves (sim.des.transfers); full mode meets at every collective, so none."""
        if self.mode is not Mode.REPRESENTATIVE:
            return {}
        rank = self.layout.representatives[k]
        return exclusive_times(cls.ops(), rank, self.layout, self.scenario, self.network.capacity)

    def _alone_time(self, rank: int, op: Send | Collective) -> float:
        """A flow-network op's time with its links to itself: the earliest it can end."""
        key: tuple[object, ...] = ((Send, op.nbytes, op.peer, rank) if isinstance(op, Send)
                                   else (op.coll, op.axis, op.nbytes, rank))
        seconds = self._alone.get(key)
        if seconds is None:
            transfers = (send_transfers(op, rank, self.layout, self.scenario) if isinstance(op, Send)
                         else collective_transfers(op, rank, (rank,), self.layout, self.scenario))
            seconds = self._alone[key] = alone_time(transfers, self.network.capacity)
        return seconds

    def _op(self, rank: int, op_id: int) -> AnyOp:
        return self.schedule.ops_by_id(self._class[rank])[op_id]

    def _execute(self, rank: int, step: int, op: AnyOp) -> Generator[simpy.Event, Any, None]:
        """An op that uses shared links: a pipeline send, a PCIe copy or a collective."""
        if isinstance(op, Copy):
            yield from self._transfer(copy_transfers(op, rank, self.scenario))
        elif isinstance(op, CpuStep):
            yield from self._cpu_step(rank, op)
        elif isinstance(op, (Send, Collective)):
            token = self.overlap.opened(rank, self.env.now, self.env.now + self._alone_time(rank, op)) \
                if self.interference else 0
            yield from self._send(rank, step, op) if isinstance(op, Send) else self._collective(rank, step, op)
            if token:
                self.overlap.closed(rank, token, self.env.now)
        else:
            raise TypeError(f"{op.name}: {type(op).__name__} has a duration of its own (local_time)")

    def _collective(self, rank: int, step: int, op: Collective) -> Generator[simpy.Event, Any, None]:
        members = self.layout.group(op.axis, rank)
        if self.mode is Mode.REPRESENTATIVE:
            yield from self._run_collective(op, rank, (rank,))
            return
        key = (step, op.id, members[0])       # a group is named by its first member
        meeting = self._meetings.get(key)
        if meeting is None:
            meeting = self._meetings[key] = Meeting(self.env.event())
        meeting.arrived += 1
        if meeting.arrived < len(members):
            yield meeting.done
            return
        del self._meetings[key]      # the last member to arrive runs it for all of them
        yield from self._run_collective(op, rank, members, meeting.done)

    def _run_collective(self, op: Collective, rank: int, simulated: tuple[int, ...],
                        done: simpy.Event | None = None) -> Generator[simpy.Event, Any, None]:
        """Latency, then the bus bytes as one flow over the ports of the simulated members
        of `rank`'s group."""
        key = (op.coll, op.axis, op.nbytes, rank, len(simulated))
        transfers = self._collectives.get(key)
        if transfers is None:     # identical collectives of identical blocks: built once
            transfers = self._collectives[key] = collective_transfers(op, rank, simulated, self.layout, self.scenario)
        for t in transfers:
            yield self.env.timeout(t.latency)
            yield self.network.transfer(t.nbytes, t.links, t.rate)
        if done is not None:
            done.succeed()
