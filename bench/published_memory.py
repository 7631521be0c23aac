"""Benchmark: the simulator's peak device memory against the peaks published runs state.

Reads the 39-column published table (shared/validation/README.md), keeps the rows that
state a peak memory or an out-of-memory outcome (sim.studies.published_memory), simulates
each row's scenario (representative mode, one step, its own process, as
bench/published_baseline.py does) and prints markdown: per row the published figure and
what it counts (allocated, reserved by the caching allocator, unstated), the simulator's
peak (the tensors alone: comparable to allocated, expected below reserved) and the error;
then the error statistics per kind, and whether the simulator agrees with each OOM.

Run: python bench/published_memory.py [CSV] [--timeout S] [--workers N]
Not a test: it takes a minute.
"""

from __future__ import annotations

import argparse
import csv
import io
import statistics
from dataclasses import dataclass
from pathlib import Path

from published_baseline import Outcome, default_csvs, run_all

from sim.core.errors import InputError
from sim.inputs.reading import read_text
from sim.inputs.scenario import Scenario
from sim.studies.fit_report import engine_label
from sim.studies.published import scenario_of
from sim.studies.published_cells import Unusable
from sim.studies.published_memory import OOM, MemoryFigure, memory_figure


@dataclass
class MemoryRow:
    id: str
    model: str
    figure: MemoryFigure
    scenario: Scenario | None
    reason: str = ""


def memory_rows(path: Path) -> list[MemoryRow]:
    """Every row of a 39-column table that states a peak memory, with its scenario or why not."""
    out = []
    for f in csv.DictReader(io.StringIO(read_text(path))):
        figure = memory_figure(f)
        if figure is None:
            continue
        scenario, reason = None, ""
        try:
            scenario, _ = scenario_of(f, [])
        except (Unusable, InputError) as e:
            reason = " ".join(str(e).split())[:120]
        out.append(MemoryRow(f.get("id", "?"), " ".join(f.get("model", "").split())[:36], figure, scenario, reason))
    return out


def error_pct(row: MemoryRow, o: Outcome) -> float | None:
    if o.peak_bytes is None or row.figure.nbytes is None:
        return None
    return 100.0 * (o.peak_bytes - row.figure.nbytes) / row.figure.nbytes


def row_line(row: MemoryRow, o: Outcome) -> str:
    s = row.scenario
    assert s is not None
    p, t = s.parallel, s.training
    published = "OOM" if row.figure.nbytes is None else f"{row.figure.nbytes / 1e9:.1f}"
    predicted = f"{o.peak_bytes / 1e9:.1f}" if o.peak_bytes is not None else o.problem.split(":")[0]
    err = error_pct(row, o)
    fits = "" if o.fits is None else ("fits" if o.fits else "does not fit")
    return (f"| {row.id} | {row.model} | {s.world_size} | {p.tp}/{p.pp}/{p.dp} | {engine_label(s)} "
            f"| {t.micro_batch} | {t.recompute.value} | {row.figure.kind} | {published} | {predicted} "
            f"| {'' if err is None else f'{err:+.1f}'} | {fits} |")


def report(rows: list[MemoryRow], outcomes: dict[str, Outcome]) -> list[str]:
    lines = ["# Simulated vs published peak memory per GPU (GB)", "",
             "| id | model | GPUs | tp/pp/dp | engine | micro | recompute | published counts | published GB "
             "| simulated GB | error % | simulated |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    simulated = [r for r in rows if r.id in outcomes]
    lines += [row_line(r, outcomes[r.id]) for r in simulated]
    lines += ["", "| published counts | rows | median abs error % | worst abs error % | median signed error % |",
              "| --- | --- | --- | --- | --- |"]
    for kind in ("allocated", "reserved", "unstated"):
        errors = [e for r in simulated if r.figure.kind == kind and (e := error_pct(r, outcomes[r.id])) is not None]
        if errors:
            lines.append(f"| {kind} | {len(errors)} | {statistics.median(abs(e) for e in errors):.1f} "
                         f"| {max(abs(e) for e in errors):.1f} | {statistics.median(errors):+.1f} |")
    ooms = [r for r in simulated if r.figure.kind == OOM]
    if ooms:
        agree = sum(1 for r in ooms if outcomes[r.id].fits is False)
        lines += ["", f"Published out-of-memory runs the simulator also finds out of memory: {agree} of {len(ooms)}."]
    skipped = [r for r in rows if r.scenario is None]
    if skipped:
        lines += ["", "## Rows with a memory figure but no scenario", "", "| id | why |", "| --- | --- |"]
        lines += [f"| {r.id} | {r.reason} |" for r in skipped]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", nargs="?", help="the 39-column published table (default: shared/validation's)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per row (default 300)")
    parser.add_argument("--workers", type=int, default=2, help="rows simulated at once (default 2)")
    args = parser.parse_args()
    path = Path(args.csv) if args.csv else next((p for p in default_csvs() if "calibration" in p.name), None)
    if path is None:
        raise SystemExit("no published-calibration.csv found: pass its path")
    rows = memory_rows(path)
    outcomes = run_all([r for r in rows if r.scenario is not None], args.workers, args.timeout)
    print("\n".join(report(rows, outcomes)))


if __name__ == "__main__":
    main()
