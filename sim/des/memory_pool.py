"""Device memory of one rank: bytes in use by category, with a timeline and the peak.

Unlike a simpy.Container, an allocation never waits: one that exceeds the capacity is
recorded as the first out-of-memory point (with the breakdown at that moment) and the
simulation goes on, so the result can say both "does not fit" and what the step would
have cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.engines.schedule import Alloc, Mem


@dataclass
class MemoryPool:
    rank: int
    capacity: float
    used: dict[Mem, float] = field(default_factory=lambda: {m: 0.0 for m in Mem})
    total: float = 0.0
    peak: float = 0.0
    peak_breakdown: dict[Mem, float] = field(default_factory=dict)
    peak_time: float = 0.0
    timeline: list[tuple[float, float]] = field(default_factory=list)
    oom: dict[str, object] | None = None

    def allocate(self, a: Alloc, now: float) -> None:
        self.used[a.category] += a.nbytes
        self._changed(now, a)

    def free(self, a: Alloc, now: float) -> None:
        self.used[a.category] -= a.nbytes
        self._changed(now, None)

    def _changed(self, now: float, cause: Alloc | None) -> None:
        used = self.used
        self.total = (used[Mem.PARAMS] + used[Mem.GRADS] + used[Mem.OPTIMIZER] + used[Mem.ACTIVATIONS]
                      + used[Mem.BUFFERS])          # in Mem's order, as sum() over the dict adds them
        timeline = self.timeline
        if timeline and timeline[-1][0] == now:
            timeline[-1] = (now, self.total)
        else:
            timeline.append((now, self.total))
        if self.total > self.peak:
            self.peak, self.peak_time = self.total, now
            self.peak_breakdown = dict(self.used)
        if cause is not None and self.total > self.capacity and self.oom is None:
            self.oom = {"time_s": now, "allocating": cause.label, "bytes": cause.nbytes,
                        "in_use_bytes": self.total, "capacity_bytes": self.capacity,
                        "breakdown": {m.value: v for m, v in self.used.items()}}
