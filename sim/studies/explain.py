"""`zerosim explain SCENARIO`: for each communication and offload class, how long it is busy,
how much of that hides behind compute, a verdict, and, found with the DES itself, what would
hide it (issue 11, item 1).

Busy time is the union of the representative rank's spans of the class; exposed time is what
the step's attribution (sim.results.attribution) blames on the class; hidden = busy -
exposed. Verdict: `hidden` when at least HIDDEN (95%) of the busy time is hidden, `partly
hidden` from PARTLY (50%), else `exposed`. The searches rerun the scenario's own table with
one key changed (sim.studies.sweep.variant), each point a full DES run:

- tokens per GPU: the smallest power-of-two micro-batch that hides the class (accumulation
  kept, so the global batch moves with it), with the peak memory it costs and whether it fits;
- bandwidth: the bus bandwidth of the group that carries the class (`[comm] busbw_GBps`:
  dp for parameter gathers and gradient reductions, tp, pp), bisected on a log scale between
  BANDWIDTH_RANGE: the lowest at which the class is still hidden;
- prefetch / bucket: ZeRO-3's `stage3_prefetch_bucket_size` (parameter gathers), DeepSpeed's
  `reduce_bucket_size` (gradient reductions): the smallest of a grid of sizes that hides it.

The searches judge a class without its post-step collectives (the parameter all-gathers
after the optimizer step: ZeRO-1/2's, and ZeRO-3's one per persistent tensor): nothing
runs beside them, so no setting hides them, and their latency alone would keep a class
from ever reaching HIDDEN. The class table counts them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sim.core.errors import InputError
from sim.inputs.load import scenario_from_table
from sim.inputs.reading import parse_toml, read_text
from sim.results.attribution import CLASSES, op_class
from sim.simulate import SimulationResult, simulate
from sim.studies.fit_params import bound_notes
from sim.studies.sweep import variant

HIDDEN, PARTLY = 0.95, 0.50
POST_STEP = "post-step"                  # the purpose of the collectives after the optimizer step
BANDWIDTH_RANGE = (1.0, 10_000.0)        # GB/s searched for the bandwidth that hides a class
BISECTIONS = 8
MICRO_BATCH_DOUBLINGS = 6                # micro-batches 1, 2, 4, ... up to 64 x the scenario's
NEGLIGIBLE = 0.01                        # a class busy for less than this share of the step: no search
BUCKETS = (1e6, 5e6, 2e7, 5e7, 1e8, 2e8, 5e8, 1e9)
AXIS_OF = {"parameter gathers": "dp", "gradient reductions": "dp", "tensor parallel": "tp", "pipeline sends": "pp"}


@dataclass(frozen=True, slots=True)
class ClassTime:
    name: str
    busy_s: float
    exposed_s: float

    @property
    def hidden_s(self) -> float:
        return max(0.0, self.busy_s - self.exposed_s)

    @property
    def hidden_share(self) -> float:
        return self.hidden_s / self.busy_s if self.busy_s > 0 else 1.0

    @property
    def verdict(self) -> str:
        return "hidden" if self.hidden_share >= HIDDEN else "partly hidden" if self.hidden_share >= PARTLY else "exposed"


@dataclass(frozen=True, slots=True)
class Finding:
    """One search's answer: the setting (None: none of those tried hides it) and what it costs."""

    what: str                  # "micro_batch", "busbw_GBps.dp", "stage3_prefetch_bucket_size", ...
    value: float | None
    tokens_per_gpu: float | None = None
    peak_bytes: float | None = None
    fits: bool | None = None
    note: str = ""
    points: tuple[tuple[float, float], ...] = ()   # (setting, exposed s of the class) the search ran


@dataclass
class Explanation:
    scenario: str
    step_time_s: float
    classes: list[ClassTime]
    findings: dict[str, list[Finding]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)   # fit_params.bound_notes of the scenario

    def to_json(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "step_time_s": self.step_time_s, "notes": self.notes,
                "thresholds": {"hidden": HIDDEN, "partly_hidden": PARTLY},
                "classes": [{"class": c.name, "busy_s": c.busy_s, "exposed_s": c.exposed_s, "hidden_s": c.hidden_s,
                             "hidden_share": c.hidden_share, "share_of_step": c.exposed_s / self.step_time_s,
                             "verdict": c.verdict,
                             "to_hide": [asdict(f) for f in self.findings.get(c.name, [])]} for c in self.classes]}


def class_times(result: SimulationResult, hideable: bool = False) -> list[ClassTime]:
    """Busy (union of the class's span intervals) and exposed seconds per class, those present;
    `hideable`: without the post-step collectives, which nothing can hide."""
    rank = result.layout.representatives[0]
    intervals: dict[str, list[tuple[float, float]]] = {}
    for sp in result.engine.spans:
        kind = op_class(sp.op) if sp.rank == rank and not (hideable and sp.op.purpose == POST_STEP) else None
        if kind is not None and sp.end > sp.start:
            intervals.setdefault(kind, []).append((sp.start, sp.end))
    exposed = dict(result.breakdown.exposed_by_class)
    if hideable:
        after_step = result.breakdown.exposed_comm_by_purpose.get(POST_STEP, 0.0)
        exposed["parameter gathers"] = max(0.0, exposed.get("parameter gathers", 0.0) - after_step)
    return [ClassTime(k, _union(intervals.get(k, [])), exposed.get(k, 0.0)) for k in CLASSES
            if intervals.get(k) or exposed.get(k, 0.0) > 0]


def _union(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def share_hidden(result: SimulationResult, name: str) -> float:
    """The hidden share of a class's hideable part (what the searches judge)."""
    found = [c for c in class_times(result, hideable=True) if c.name == name]
    return found[0].hidden_share if found else 1.0


def exposed(result: SimulationResult, name: str) -> float:
    return result.breakdown.exposed_by_class.get(name, 0.0)


class Searcher:
    """Runs variants of one scenario table for the searches."""

    def __init__(self, raw: Mapping[str, Any], path: Path, base: SimulationResult) -> None:
        self.raw, self.path, self.base = raw, path, base

    def run(self, assignment: Mapping[str, Any]) -> SimulationResult | None:
        try:
            return simulate(scenario_from_table(variant(self.raw, assignment), self.path, self.path.stem))
        except InputError:
            return None

    def micro_batch(self, name: str) -> Finding:
        t = self.base.scenario.training
        dp = self.base.scenario.parallel.dp
        points: list[tuple[float, float]] = []
        for k in range(0, (t.micro_batch * 2**MICRO_BATCH_DOUBLINGS).bit_length()):
            micro = 2**k
            r = self.base if micro == t.micro_batch else self.run({"training.micro_batch": micro, "training.global_batch": micro * dp * t.grad_accum,
                          "training.grad_accum": t.grad_accum})
            if r is None:
                continue
            points.append((float(micro * t.seq_len * t.grad_accum), exposed(r, name)))
            if share_hidden(r, name) >= HIDDEN:
                return Finding("micro_batch", micro, micro * t.seq_len * t.grad_accum, r.peak_pool().peak, r.fits,
                               points=tuple(points))
        return Finding("micro_batch", None, note=f"not hidden up to micro-batch {t.micro_batch * 2**MICRO_BATCH_DOUBLINGS}",
                       points=tuple(points))

    def bandwidth(self, name: str) -> Finding:
        axis = AXIS_OF[name]
        key = f"comm.busbw_GBps.{axis}"
        low, high = BANDWIDTH_RANGE
        top = self.run({key: high})
        if top is None or share_hidden(top, name) < HIDDEN:
            return Finding(key, None, note=f"not hidden even at {high:g} GB/s: latency, host or order bound")
        best, points = top, [(high, exposed(top, name))]
        for _ in range(BISECTIONS):      # log-scale bisection: hidden at `high`, maybe not at `low`
            mid = (low * high) ** 0.5
            r = self.run({key: mid})
            if r is not None:
                points.append((mid, exposed(r, name)))
            if r is not None and share_hidden(r, name) >= HIDDEN:
                high, best = mid, r
            else:
                low = mid
        return Finding(key, high, peak_bytes=best.peak_pool().peak, fits=best.fits, points=tuple(sorted(points)))

    def bucket(self, name: str) -> Finding | None:
        z = self.base.scenario.zero
        if z is None:
            return None
        key = ("zero.stage3_prefetch_bucket_size" if name == "parameter gathers" and int(z.stage) == 3 else
               "zero.reduce_bucket_size" if name == "gradient reductions" else None)
        if key is None:
            return None
        for size in BUCKETS:
            r = self.run({key: size})
            if r is not None and share_hidden(r, name) >= HIDDEN:
                return Finding(key, size, peak_bytes=r.peak_pool().peak, fits=r.fits)
        return Finding(key, None, note=f"not hidden by any size up to {BUCKETS[-1]:g}")


def explain(scenario: str | Path, *, search: bool = True) -> Explanation:
    """The class table of `scenario`, and with `search` what would hide each class."""
    path = Path(scenario)
    raw = parse_toml(read_text(path), path)
    base = simulate(scenario_from_table(raw, path, path.stem))
    out = Explanation(base.scenario.name, base.step_time_s, class_times(base), notes=bound_notes(base.scenario))
    if not search:
        return out
    searcher = Searcher(raw, path, base)
    for c in out.classes:
        if c.busy_s < NEGLIGIBLE * base.step_time_s:
            continue
        findings = [searcher.micro_batch(c.name)]
        if c.name in AXIS_OF:
            findings.append(searcher.bandwidth(c.name))
        bucket = searcher.bucket(c.name)
        if bucket is not None:
            findings.append(bucket)
        out.findings[c.name] = findings
    return out
