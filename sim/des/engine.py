"""The discrete-event engine: ranks with CUDA-like streams, shared links, memory pools.

Each simulated rank runs one SimPy process per stream, walking that stream's ops in order
(CUDA stream semantics); an op starts when the previous op of its stream has ended and
every dependency (an event on another stream) has fired. Collectives meet at a rendezvous
(full mode: every member rank is simulated) or run for the representative rank alone
(representative mode: one rank per class stands for all its symmetric peers; its links
carry the same flows, so both modes give the same times on symmetric layouts).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import simpy

from sim.analytic import opcost
from sim.core.enums import Coll
from sim.des.memory_pool import MemoryPool
from sim.des.network import FlowNetwork
from sim.engines.layout import Layout
from sim.engines.schedule import Kind, Op, Schedule, Stream
from sim.inputs.scenario import Scenario


def local_time(op: Op, s: Scenario) -> float | None:
    """Duration of an op that shares no link (sim.analytic.opcost.device_op_time)."""
    return opcost.device_op_time(op.kind.value, flops=op.flops, mem_bytes=op.mem_bytes,
                                 elementwise_bytes=op.elementwise_bytes, params=op.params,
                                 precision=s.training.precision.value, cluster=s.cluster,
                                 ranks_per_node=s.gpus_per_node)


class Mode(StrEnum):
    REPRESENTATIVE = "representative"
    FULL = "full"


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts the events it processes (for the benchmark)."""

    def __init__(self) -> None:
        super().__init__()
        self.processed = 0

    def step(self) -> None:
        self.processed += 1
        super().step()


@dataclass(frozen=True, slots=True)
class Span:
    """One executed op: when it was ready, when it started and ended, what held it up."""

    rank: int
    step: int
    op: Op
    ready: float
    start: float
    end: float
    blocker: Op | None     # the dependency that ended last, when the op had to wait for it


@dataclass
class EventEngine:
    scenario: Scenario
    schedule: Schedule
    layout: Layout
    mode: Mode = Mode.REPRESENTATIVE
    serial: bool = False        # run every op of a rank one at a time, in issue order
    env: CountingEnvironment = field(default_factory=CountingEnvironment)
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
            capacity[(r, Stream.H2D)] = capacity[(r, Stream.D2H)] = opcost.pcie_bandwidth(cluster)
        self.network = FlowNetwork(self.env, capacity)
        self.pools = {r: MemoryPool(r, cluster.gpu.memory) for r in self.ranks}
        self._meetings: dict[tuple[Any, ...], list[Any]] = {}
        self._sends: dict[tuple[int, str, int], list[Any]] = {}   # (step, tag, receiver) -> [event, op]

    # -- running ---------------------------------------------------------------------------
    def run(self, steps: int = 1) -> None:
        """Simulate `steps` optimizer steps back to back; `spans` holds the last one's ops,
        `step_bounds` every step's start and end."""
        for r in self.ranks:
            for alloc in self.schedule.classes[self.layout.class_of(r)].resident:
                self.pools[r].allocate(alloc, 0.0)
        for step in range(steps):
            self.spans.clear()     # only the last step's records are kept: memory bounded by one step
            start = self.env.now
            done: dict[int, dict[int, simpy.Event]] = {}
            ends: dict[int, dict[int, float]] = {}
            procs = []
            for r in self.ranks:
                cls = self.schedule.classes[self.layout.class_of(r)]
                done[r] = {op.id: self.env.event() for op in cls.ops()}
                ends[r] = {}
                lanes = [sorted(cls.ops(), key=lambda o: o.id)] if self.serial else list(cls.streams.values())
                for ops in lanes:
                    procs.append(self.env.process(self._stream(r, step, ops, done[r], ends[r])))
            self.env.run(until=self.env.all_of(procs))
            self.step_bounds.append((start, self.env.now))

    def _stream(self, rank: int, step: int, ops: list[Op], done: dict[int, simpy.Event],
                ends: dict[int, float]) -> Generator[simpy.Event, Any, None]:
        pool = self.pools[rank]
        for op in ops:
            ready = self.env.now
            if op.deps:
                yield self.env.all_of([done[d] for d in op.deps])
            local_end = self.env.now
            for tag in op.waits_for:     # a pipeline send from the neighbouring stage
                yield self._send_slot(step, tag, rank)[0]
            blocker = None
            if self.env.now > local_end:
                blocker = max((self._send_slot(step, t, rank) for t in op.waits_for),
                              key=lambda slot: (slot[2], slot[1].id))[1]
            elif self.env.now > ready:
                last = max(op.deps, key=lambda d: (ends[d], d))
                blocker = self._op(rank, last)
            start = self.env.now
            for alloc in op.alloc:
                pool.allocate(alloc, start)
            yield from self._execute(rank, step, op)
            for alloc in op.free:
                pool.free(alloc, self.env.now)
            ends[op.id] = self.env.now
            self.spans.append(Span(rank, step, op, ready, start, self.env.now, blocker))
            done[op.id].succeed()

    def _send_slot(self, step: int, tag: str, receiver: int) -> list[Any]:
        """[event, sending op, time] of a pipeline send, created by whichever side comes first."""
        return self._sends.setdefault((step, tag, receiver), [self.env.event(), None, 0.0])

    def _send(self, rank: int, step: int, op: Op) -> Generator[simpy.Event, Any, None]:
        """A pipeline send: the activation (or its gradient) crosses to the neighbouring stage."""
        c = self.layout.coords(rank)
        receiver = self.layout.rank(type(c)(c.dp, c.pp + op.peer, c.tp))
        nodes, per_node = self.layout.span((rank, receiver))
        for phase in opcost.collective_phases(op.coll or Coll.SEND_RECV, op.nbytes,
                                              opcost.GroupShape(2, nodes, per_node), self.scenario.cluster):
            yield self.env.timeout(phase.latency)
            links = [((rank, link), mult) for link, mult in phase.links if (rank, link) in self.network.capacity]
            yield self.network.transfer(phase.bus_bytes, links, self.scenario.comm.override(op.axis))
        slot = self._send_slot(step, op.tag, receiver)
        slot[1], slot[2] = op, self.env.now
        slot[0].succeed()

    def _op(self, rank: int, op_id: int) -> Op:
        return self.schedule.ops_by_id(self.layout.class_of(rank))[op_id]

    def _execute(self, rank: int, step: int, op: Op) -> Generator[simpy.Event, Any, None]:
        cluster = self.scenario.cluster
        alone = local_time(op, self.scenario)
        if alone is not None:
            yield self.env.timeout(alone)
        elif op.tag:
            yield from self._send(rank, step, op)
        elif op.kind is Kind.COPY:
            yield self.env.timeout(cluster.host.pcie.latency)
            yield self.network.transfer(op.nbytes, [((rank, op.direction or op.stream), 1.0)])
        else:
            yield from self._collective(rank, step, op)

    def _collective(self, rank: int, step: int, op: Op) -> Generator[simpy.Event, Any, None]:
        assert op.axis is not None and op.coll is not None
        members = self.layout.group(op.axis, rank)
        if self.mode is Mode.REPRESENTATIVE:
            yield self.env.process(self._run_collective(op, rank, (rank,)))
            return
        key = (step, op.id, members)
        meeting = self._meetings.setdefault(key, [0, self.env.event()])
        meeting[0] += 1
        if meeting[0] == len(members):
            del self._meetings[key]
            self.env.process(self._run_collective(op, rank, members, meeting[1]))
        yield meeting[1]

    def _run_collective(self, op: Op, rank: int, simulated: tuple[int, ...],
                        done: simpy.Event | None = None) -> Generator[simpy.Event, Any, None]:
        """Latency, then the bus bytes as one flow over the ports of the simulated members
        of `rank`'s group."""
        assert op.axis is not None
        nodes, per_node = self.layout.group_span(op.axis, rank)
        shape = opcost.GroupShape(len(self.layout.group(op.axis, rank)), nodes, per_node)
        override = self.scenario.comm.override(op.axis)
        assert op.coll is not None
        for phase in opcost.collective_phases(op.coll, op.nbytes, shape, self.scenario.cluster,
                                              self.scenario.comm.algorithm):
            yield self.env.timeout(phase.latency)
            links = [((r, link), mult) for r in simulated for link, mult in phase.links]
            yield self.network.transfer(phase.bus_bytes, links, override or phase.rate)
        if done is not None:
            done.succeed()
