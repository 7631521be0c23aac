"""Links shared by concurrent transfers: a fluid (processor-sharing) model in SimPy.

Every transfer is a flow of bytes over a set of links; each link's capacity is divided
equally among the flows on it, and a flow moves at the smallest share over its links
(times a multiplier: a group with p members per node uses p NIC ports at once). Rates are
recomputed whenever a flow starts or ends, so two collectives on one NIC each get half
of it, and a transfer alone gets the full rate: then its time is exactly bytes / rate,
the closed form of sim.analytic.opcost.

Only the flows a change can affect are touched: those connected to the starting or ending
flow through shared links (its component). Each flow keeps the time its remaining bytes
were last brought up to date and its own completion timer; a rate change re-times the
flows of the component only, so the work per change does not grow with the flows of other
ranks or other links.
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
    updated: float = 0.0                      # when `remaining` was last brought up to date
    version: int = 0                          # bumps at every re-timing; older timers are void


@dataclass
class FlowNetwork:
    """All links of one simulation and the flows on them."""

    env: simpy.Environment
    capacity: dict[LinkId, float]
    bytes_on: dict[LinkId, float] = field(default_factory=dict)
    flows_on: dict[LinkId, list[Flow]] = field(default_factory=dict)
    _count: int = 0

    def transfer(self, nbytes: float, links: Sequence[tuple[LinkId, float]],
                 override: float | None = None) -> simpy.Event:
        """Start a flow now; the returned event fires when its last byte has moved."""
        done = self.env.event()
        if nbytes <= 0:
            done.succeed()
            return done
        for link, _ in links:
            self.bytes_on[link] = self.bytes_on.get(link, 0.0) + nbytes
        self._count += 1
        flow = Flow(nbytes, tuple(links), done, override=override, order=self._count, updated=self.env.now)
        for link, _ in flow.links:
            self.flows_on.setdefault(link, []).append(flow)
        self._retime(self._component([flow]))
        return done

    @property
    def flows(self) -> list[Flow]:
        """Every flow in progress (for tests and traces)."""
        return sorted({f for fs in self.flows_on.values() for f in fs}, key=lambda f: f.order)

    def _component(self, seeds: list[Flow]) -> list[Flow]:
        """The flows connected to `seeds` through shared links, in start order."""
        seen = {id(f): f for f in seeds}
        todo = list(seeds)
        while todo:
            for link, _ in todo.pop().links:
                for other in self.flows_on.get(link, ()):
                    if id(other) not in seen:
                        seen[id(other)] = other
                        todo.append(other)
        return sorted(seen.values(), key=lambda f: f.order)

    def _settle(self, flows: list[Flow]) -> None:
        """Bring each flow's remaining bytes up to now at its current rate."""
        now = self.env.now
        for f in flows:
            if now > f.updated:
                f.remaining -= f.rate * (now - f.updated)
            f.updated = now

    def _retime(self, flows: list[Flow]) -> None:
        """New rates for a component whose membership changed, and new completion timers."""
        self._settle(flows)
        for f in flows:
            if f.override is not None:
                users = max(len(self.flows_on[link]) for link, _ in f.links) if f.links else 1
                f.rate = f.override / users
            else:
                f.rate = min(self.capacity[link] * mult / len(self.flows_on[link]) for link, mult in f.links)
            f.version += 1
            timer = self.env.timeout(max(0.0, f.remaining / f.rate))
            timer.callbacks.append(self._finisher(f, f.version))

    def _finisher(self, flow: Flow, version: int):  # noqa: ANN202 - a SimPy callback
        def finish(_event: simpy.Event) -> None:
            if flow.version == version and flow.remaining > 0:
                self._finish(flow)
        return finish

    def _finish(self, first: Flow) -> None:
        """`first` has moved its last byte; so has any flow of its component that is within
        rounding of done. They leave, and the rest of the component is re-timed."""
        component = self._component([first])
        self._settle(component)
        first.remaining = 0.0
        finished = [f for f in component if f is first or f.remaining <= 1e-9 * max(1.0, f.rate)]
        for f in finished:
            f.remaining = 0.0
            f.version += 1
            for link, _ in f.links:
                self.flows_on[link].remove(f)
                if not self.flows_on[link]:
                    del self.flows_on[link]
        for f in finished:
            f.done.succeed()
        rest = [f for f in component if f.remaining > 0]
        if rest:
            self._retime(self._component(rest))
