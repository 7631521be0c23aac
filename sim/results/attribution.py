"""StepResult: what one simulated step cost, where the time went, what memory it took.

Every moment of the step on the representative rank's compute stream is attributed to
exactly one cause, so compute + exposed communication + exposed offload + bubble +
optimizer = step time: a compute-stream op's own duration (compute, optimizer, or a
collective / copy issued on the compute stream), or the wait before an op, blamed on the
dependency that ended last (a collective, a copy or the CPU optimizer), or the tail after
the last compute op, blamed on the op that ended the step.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from sim.core.enums import Axis
from sim.des.engine import Span
from sim.engines.schedule import AnyOp, Collective, Compute, Copy, CpuStep, GpuOptimizer, Send, Stream

CHAIN_HOPS = 16     # blockers followed back from a wait (a pipeline's chains are long; their tail is one cause)
PARAMETER_PURPOSES = ("fetch", "prefetch", "root", "param bucket", "post-step")
GRADIENT_PURPOSES = ("grad bucket", "grad", "grad norm", "overflow check")
CLASSES = ("parameter gathers", "gradient reductions", "tensor parallel", "pipeline sends", "D2H",
           "CPU optimizer", "H2D", "NVMe", "other communication")


def op_class(op: AnyOp) -> str | None:
    """The communication or offload class an op belongs to (None: compute and GPU optimizer)."""
    if isinstance(op, Send):
        return "pipeline sends"
    if isinstance(op, Compute) and op.stream is not Stream.COMPUTE:
        return "gradient reductions"   # kernels on a reduction stream (side_compute): they serve its buckets
    if isinstance(op, Collective):
        if op.axis is Axis.TP:
            return "tensor parallel"
        if op.purpose in PARAMETER_PURPOSES:
            return "parameter gathers"
        return "gradient reductions" if op.purpose in GRADIENT_PURPOSES else "other communication"
    if isinstance(op, CpuStep):
        return "CPU optimizer"
    if isinstance(op, Copy):
        return {Stream.D2H: "D2H", Stream.H2D: "H2D"}.get(op.direction, "NVMe")
    return None


@dataclass
class TimeBreakdown:
    compute_s: float = 0.0
    exposed_comm_s: float = 0.0
    exposed_offload_s: float = 0.0
    bubble_s: float = 0.0
    optimizer_s: float = 0.0
    exposed_host_s: float = 0.0     # the device waited for the host to issue work (sim.des.host)
    exposed_by_kind: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    exposed_by_layer: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    exposed_by_class: dict[str, float] = field(default_factory=lambda: defaultdict(float))   # op_class
    exposed_comm_by_purpose: dict[str, float] = field(default_factory=lambda: defaultdict(float))   # Collective.purpose

    def blame(self, op: AnyOp, seconds: float) -> None:
        """Attribute `seconds` of the compute stream to `op`."""
        if seconds <= 0:
            return
        kind = op_class(op)
        if kind is not None:
            self.exposed_by_class[kind] += seconds
        if isinstance(op, Compute) and op.stream is not Stream.COMPUTE:
            # the copies and quantizers a reduction stream runs around its collectives: what
            # the compute stream waits for there is the gradient reduction's exposed time
            self.exposed_comm_s += seconds
            self.exposed_by_kind[f"kernels on the {op.stream} stream"] += seconds
            self.exposed_comm_by_purpose["grad bucket"] += seconds
            self.exposed_by_layer["-" if op.layer is None else str(op.layer)] += seconds
        elif isinstance(op, Compute):
            self.compute_s += seconds
        elif isinstance(op, GpuOptimizer):
            self.optimizer_s += seconds
        elif isinstance(op, Copy | CpuStep):
            self.exposed_offload_s += seconds
        elif isinstance(op, Send):
            self.bubble_s += seconds
        else:
            assert isinstance(op, Collective)
            self.exposed_comm_s += seconds
            self.exposed_by_kind[f"{op.coll} ({op.purpose})" if op.purpose else str(op.coll)] += seconds
            self.exposed_comm_by_purpose[op.purpose] += seconds
            self.exposed_by_layer["-" if op.layer is None else str(op.layer)] += seconds

    @property
    def total(self) -> float:
        return (self.compute_s + self.exposed_comm_s + self.exposed_offload_s + self.bubble_s + self.optimizer_s
                + self.exposed_host_s)


def attribute(spans: Sequence[Span], step_start: float, step_end: float, serial: bool = False) -> TimeBreakdown:
    """Walk one rank's spans of one step and attribute its compute-stream timeline (every
    op when the rank ran serially)."""
    out = TimeBreakdown()
    compute = sorted((s for s in spans if serial or s.op.stream is Stream.COMPUTE), key=lambda s: (s.start, s.op.id))
    by_id = {s.op.id: s for s in spans}
    for s in compute:
        wait = s.start - s.ready
        if wait > 0:
            host = min(s.host_wait, wait)
            out.exposed_host_s += host
            rest = wait - host
            if s.blocker is not None:
                _blame_chain(out, by_id, s.blocker, s.start - rest, s.start)
            else:   # only rounding is left when the host alone held the op
                assert rest <= 1e-9 * max(1.0, s.start), (s.op.name, rest)
                out.exposed_host_s += rest
        out.exposed_host_s += s.host_inside
        out.blame(s.op, s.end - s.start - s.host_inside)
    tail_from = compute[-1].end if compute else step_start
    if step_end > tail_from:
        last = max(spans, key=lambda s: (s.end, s.op.id))
        _blame_chain(out, by_id, last.op, tail_from, step_end)
    return out


def _blame_chain(out: TimeBreakdown, by_id: dict[int, Span], blocker: AnyOp, t0: float, t1: float) -> None:
    """Attribute the compute stream's wait [t0, t1] along the chain of blockers: the part
    while the blocker ran is its own; the part before it began goes to what it was waiting
    for, and so on back (a copy waiting for CPU-Adam exposes CPU-Adam, not the copy); what
    is left when the chain ends, or after CHAIN_HOPS links, stays with the last op of it."""
    op = blocker
    for _ in range(CHAIN_HOPS):
        sp = by_id.get(op.id)
        if t1 <= t0:
            return
        if sp is None or sp.op is not op or sp.start <= t0 or sp.blocker is None:
            break   # (a blocker of another rank, a pipeline send, has no span here: ids are per rank)
        out.blame(op, t1 - sp.start)
        t1, op = sp.start, sp.blocker
    out.blame(op, t1 - t0)
