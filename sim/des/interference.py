"""Compute-communication interference as processor sharing: while a collective or pipeline
send of its rank is in flight, the rank's compute runs at 1 / (1 + c) of its rate, c being
the GPU's `comm_interference` (NCCL's kernels take SMs and HBM bandwidth: arXiv 2507.03114
measures an 18.9% mean and 40% worst GEMM slowdown beside a collective on A100 / H100;
Calculon uses 15% on NVLink). So a compute op overlapped for a time M by communication
loses M x c / (1 + c) of work and ends that much later, whether the collective began
before the op or during it, and an op that no collective overlaps is not slowed.

The engine times a compute op (or a run of joined ops) alone and, when that time is up,
asks `shortfall` how much work the overlap took from it; it waits that long and asks
again (communication may go on meanwhile), until nothing is missing. `step` bounds each
wait so the op never ends late: while a collective is known to be in flight (one timed in
closed form until its end, one on the flow network at least for its time alone, which
sharing links only lengthens), the op advances at the shared rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

TOLERANCE_S = 1e-9      # work left below this ends the op


@dataclass(slots=True)
class RankComm:
    """The communication of one rank that its kernels may still overlap: finished or
    closed-form intervals, those in flight on the flow network (start, end at the earliest),
    and when the kernel runs now under way on each stream began."""

    intervals: list[tuple[float, float]] = field(default_factory=list)
    open: dict[int, tuple[float, float]] = field(default_factory=dict)   # token -> (start, earliest end)
    running: dict[object, float] = field(default_factory=dict)          # stream -> start of its kernels


class Interference:
    """Per-rank communication intervals, and the work compute loses beside them."""

    def __init__(self, ranks: list[int], factor: float) -> None:
        self.factor = factor
        self.ranks = {r: RankComm() for r in ranks}
        self._token = 0

    def timed(self, rank: int, start: float, end: float) -> None:
        """A collective or send timed in closed form: in flight from `start` to `end`."""
        self.ranks[rank].intervals.append((start, end))

    def opened(self, rank: int, start: float, earliest_end: float) -> int:
        """A collective or send on the flow network began; returns its token for `closed`."""
        self._token += 1
        self.ranks[rank].open[self._token] = (start, earliest_end)
        return self._token

    def closed(self, rank: int, token: int, end: float) -> None:
        start, _ = self.ranks[rank].open.pop(token)
        self.ranks[rank].intervals.append((start, end))

    def began(self, rank: int, stream: object, start: float) -> None:
        """Kernels of `stream` began at `start`. Intervals that ended before every run under
        way began can no longer matter (each stream's later runs start later)."""
        comm = self.ranks[rank]
        comm.running[stream] = start
        oldest = min(comm.running.values())
        comm.intervals = [iv for iv in comm.intervals if iv[1] > oldest]

    def ended(self, rank: int, stream: object) -> None:
        self.ranks[rank].running.pop(stream, None)

    def overlapped(self, rank: int, a: float, b: float) -> float:
        """Seconds of [a, b] during which some communication of `rank` was in flight."""
        comm = self.ranks[rank]
        spans = sorted([(max(s, a), min(e, b)) for s, e in comm.intervals if s < b and e > a]
                       + [(max(s, a), b) for s, _ in comm.open.values() if s < b])
        total, reach = 0.0, a
        for s, e in spans:
            if e > reach:
                total += e - max(s, reach)
                reach = e
        return total

    def shortfall(self, rank: int, start: float, now: float, work: float,
                  idle: Sequence[tuple[float, float]] = ()) -> float:
        """Work (seconds at the full rate) kernels that began at `start` with `work` to do
        still lack at `now`: the time spent, less what the overlap took, against `work`. The
        `idle` windows (ops of the run that are not kernels) count for neither."""
        c = self.factor
        busy = (now - start) - sum(e - s for s, e in idle)
        beside = self.overlapped(rank, start, now) - sum(self.overlapped(rank, s, e) for s, e in idle)
        left = work - (busy - beside * c / (1.0 + c))
        return left if left > TOLERANCE_S else 0.0

    def step(self, rank: int, now: float, left: float) -> float:
        """How long to wait for `left` seconds of work: at the shared rate for as long as a
        collective is known to stay in flight, at the full rate after."""
        c = self.factor
        comm = self.ranks[rank]
        known = max([e for s, e in comm.intervals if s <= now < e]
                    + [e for s, e in comm.open.values() if s <= now], default=now)
        shared = min(max(known - now, 0.0), left * (1.0 + c))
        return shared + (left - shared / (1.0 + c))
