"""Links shared by concurrent transfers: a fluid (processor-sharing) model in SimPy.

Every transfer is a flow of bytes over a set of links; each link's capacity is divided
equally among the flows on it, and a flow moves at the smallest share over its links
(times a multiplier: a group with p members per node uses p NIC ports at once). Rates are
recomputed whenever a flow starts or ends, so two collectives on one NIC each get half
of it, and a transfer alone gets the full rate: then its time is exactly bytes / rate,
the closed form of sim.analytic.opcost.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import simpy

LinkId = Hashable


@dataclass(eq=False)
class Flow:
    remaining: float
    links: tuple[tuple[LinkId, float], ...]   # (link, multiplier)
    done: simpy.Event
    rate: float = 0.0
    override: float | None = None             # fixed rate (a bus-bandwidth table entry)
    order: int = 0


@dataclass
class FlowNetwork:
    """All links of one simulation and the flows on them."""

    env: simpy.Environment
    capacity: dict[LinkId, float]
    flows: list[Flow] = field(default_factory=list)
    bytes_on: dict[LinkId, float] = field(default_factory=dict)
    _last: float = 0.0
    _version: int = 0
    _count: int = 0

    def transfer(self, nbytes: float, links: Sequence[tuple[LinkId, float]],
                 override: float | None = None) -> simpy.Event:
        """Start a flow now; the returned event fires when its last byte has moved."""
        done = self.env.event()
        if nbytes <= 0:
            done.succeed()
            return done
        self._settle()
        for link, _ in links:
            self.bytes_on[link] = self.bytes_on.get(link, 0.0) + nbytes
        self._count += 1
        self.flows.append(Flow(nbytes, tuple(links), done, override=override, order=self._count))
        self._reschedule()
        return done

    def _settle(self) -> None:
        """Advance every flow's remaining bytes to now at its current rate."""
        elapsed = self.env.now - self._last
        if elapsed > 0:
            for f in self.flows:
                f.remaining -= f.rate * elapsed
        self._last = self.env.now

    def _rates(self) -> None:
        users: dict[LinkId, int] = {}
        for f in self.flows:
            for link, _ in f.links:
                users[link] = users.get(link, 0) + 1
        for f in self.flows:
            if f.override is not None:
                f.rate = f.override / max(users[link] for link, _ in f.links) if f.links else f.override
            else:
                f.rate = min(self.capacity[link] * mult / users[link] for link, mult in f.links)

    def _reschedule(self) -> None:
        self._rates()
        self._version += 1
        if not self.flows:
            return
        first = min(self.flows, key=lambda f: (f.remaining / f.rate, f.order))
        timer = self.env.timeout(max(0.0, first.remaining / first.rate))
        version = self._version
        timer.callbacks.append(lambda _ev: self._finish(version, first))

    def _finish(self, version: int, first: Flow) -> None:
        if version != self._version:
            return  # superseded by a later start or finish
        self._settle()
        first.remaining = 0.0
        finished = [f for f in self.flows if f is first or f.remaining <= 1e-9 * max(1.0, f.rate)]
        self.flows = [f for f in self.flows if f not in finished]
        for f in sorted(finished, key=lambda f: f.order):
            f.done.succeed()
        self._reschedule()
