"""Benchmark: the simulator's step time against published measurements.

Reads the published-measurement tables (shared/validation/README.md; both formats, via
sim.studies.published), simulates every usable row (representative mode, one step) in
its own process with a per-row timeout, two at a time, and prints markdown: one line per
row (measured, predicted, error = (pred - meas) / meas), the error statistics overall, per
reliability tier, per engine and per source, the rows that could not be simulated, and
the unusable rows grouped by reason.

Run: python bench/published_baseline.py [CSV ...] [--timeout S] [--workers N] [--only ID]
Without CSV arguments it reads shared/validation/published-*.csv next to the repository
(or $ZEROSIM_PUBLISHED_DIR). Not a test: it takes minutes.
"""

from __future__ import annotations

import argparse
import csv
import io
import multiprocessing as mp
import os
import re
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol

from sim.core.errors import InputError
from sim.des.engine import Mode
from sim.engines.plan import check_work
from sim.inputs.reading import read_text
from sim.inputs.scenario import Scenario
from sim.simulate import simulate
from sim.studies.fit_report import engine_label
from sim.studies.published import PublishedRow, read_rows

ROOT = Path(__file__).resolve().parent.parent


def default_csvs() -> list[Path]:
    env = os.environ.get("ZEROSIM_PUBLISHED_DIR")
    for folder in ([Path(env)] if env else []) + [ROOT.parent / "shared" / "validation", ROOT / "shared" / "validation"]:
        found = sorted(folder.glob("published-*.csv"))
        if found:
            return found
    return []


def calibration_table(description: str) -> Path:
    """The published-calibration.csv a table benchmark reads: its one optional argument,
    else the shared folder's."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", nargs="?", type=Path, default=None)
    path = parser.parse_args().csv or next((p for p in default_csvs() if p.name == "published-calibration.csv"), None)
    if path is None:
        raise SystemExit("published-calibration.csv not found (../shared/validation)")
    return path


def template_rows(path: Path, ids: set[str]) -> dict[str, dict[str, str]]:
    """The cells of the rows `ids`, to build a publication's other rows from."""
    rows = csv.DictReader(io.StringIO(read_text(path)))
    return {r["id"]: {k: (v or "") for k, v in r.items() if k} for r in rows if r.get("id") in ids}


class Simulable(Protocol):
    """A row with an id and the scenario it describes."""

    @property
    def id(self) -> str: ...

    @property
    def scenario(self) -> Scenario | None: ...


@dataclass
class Outcome:
    predicted_s: float | None = None
    fits: bool | None = None
    problem: str = ""     # refused / timed out / failed
    peak_bytes: float | None = None   # the representative rank's peak device memory (allocated)
    wall_s: float = 0.0


def _child(s: Scenario, conn: Connection) -> None:
    try:
        check_work(s, steps=1, full=False)
        r = simulate(s, steps=1, mode=Mode.REPRESENTATIVE)
        conn.send((r.step_time_s, r.fits, r.peak_pool().peak, ""))
    except InputError as e:
        conn.send((None, None, None, f"refused: {e.problem}"))
    except Exception as e:  # report, never hang the parent
        conn.send((None, None, None, f"failed: {type(e).__name__}: {e}"))
    finally:
        conn.close()


def run_all(rows: Sequence[Simulable], workers: int, timeout: float) -> dict[str, Outcome]:
    """Simulate each row's scenario in a fresh process, `workers` at a time."""
    ctx = mp.get_context("fork")
    todo, out = list(rows), {}
    running: list[tuple[Simulable, Any, Connection, float]] = []
    while todo or running:
        while todo and len(running) < workers:
            row = todo.pop(0)
            parent, child = ctx.Pipe(duplex=False)
            assert row.scenario is not None
            proc = ctx.Process(target=_child, args=(row.scenario, child), daemon=True)
            proc.start()
            child.close()
            running.append((row, proc, parent, time.monotonic()))
        time.sleep(0.05)
        for item in list(running):
            row, proc, parent, start = item
            elapsed = time.monotonic() - start
            if parent.poll():
                try:
                    pred, fits, peak, problem = parent.recv()
                except EOFError:
                    pred, fits, peak, problem = None, None, None, "failed: the worker died"
                out[row.id] = Outcome(pred, fits, problem, peak_bytes=peak, wall_s=elapsed)
            elif not proc.is_alive():
                out[row.id] = Outcome(problem=f"failed: the worker exited ({proc.exitcode})", wall_s=elapsed)
            elif elapsed > timeout:
                proc.kill()
                out[row.id] = Outcome(problem=f"timed out after {timeout:g} s", wall_s=elapsed)
            else:
                continue
            proc.join(1)
            parent.close()
            running.remove(item)
    return out


def error_pct(row: PublishedRow, o: Outcome) -> float | None:
    if o.predicted_s is None or row.measured_step_s is None:
        return None
    return 100.0 * (o.predicted_s - row.measured_step_s) / row.measured_step_s


def row_line(row: PublishedRow, o: Outcome) -> str:
    s = row.scenario
    assert s is not None
    p, t = s.parallel, s.training
    err = error_pct(row, o)
    pred = f"{o.predicted_s:.3f}" if o.predicted_s is not None else o.problem.split(":")[0]
    fits = "" if o.fits is None else ("yes" if o.fits else "NO")
    return (f"| {row.id} | {row.tier} | {row.source} | {row.model[:40]} | {s.world_size} | {p.tp}/{p.pp}/{p.dp} "
            f"| {engine_label(s)} | {t.micro_batch}/{t.global_batch} | {row.measured_step_s:.3f} | {pred} "
            f"| {'' if err is None else f'{err:+.1f}'} | {fits} |")


def stats_line(name: str, errors: list[float]) -> str:
    if not errors:
        return f"| {name} | 0 | | | |"
    return (f"| {name} | {len(errors)} | {statistics.median(abs(e) for e in errors):.1f} "
            f"| {max(abs(e) for e in errors):.1f} | {statistics.median(errors):+.1f} |")


def reason_key(reason: str) -> str:
    """A reason without its row-specific parts (ids, quoted cells, numbers, model names)."""
    key = re.sub(r"^published/\S+: ", "", reason)
    key = re.sub(r"'[^']*'", "'…'", key)
    key = re.sub(r"layers of [^;]*", "layers of the model", key)
    key = re.sub(r"\b\d+(\.\d+)?\b", "N", key)
    return key.split("; allowed")[0]


def report(rows: list[PublishedRow], outcomes: dict[str, Outcome]) -> list[str]:
    lines = ["# Simulated vs published step time", "",
             "| id | tier | source | model | GPUs | tp/pp/dp | engine | micro/global | measured s | predicted s "
             "| error % | fits |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    usable = [r for r in rows if r.usable]
    lines += [row_line(r, outcomes[r.id]) for r in usable if r.id in outcomes]
    errors = {r.id: e for r in usable if r.id in outcomes and (e := error_pct(r, outcomes[r.id])) is not None}
    lines += ["", f"Rows: {len(rows)}; with a scenario and a measured step: {len(usable)}; simulated: {len(errors)}.", ""]
    lines += ["| group | rows | median abs error % | worst abs error % | median signed error % |",
              "| --- | --- | --- | --- | --- |", stats_line("all", list(errors.values()))]
    by: dict[str, list[float]] = defaultdict(list)
    for r in usable:
        if r.id in errors:
            assert r.scenario is not None
            by[f"tier {r.tier}"].append(errors[r.id])
            by[f"engine {engine_label(r.scenario)}"].append(errors[r.id])
            by[f"source {r.source}"].append(errors[r.id])
            by[f"fits {'yes' if outcomes[r.id].fits else 'NO'}"].append(errors[r.id])
    lines += [stats_line(k, by[k]) for k in sorted(by)]
    if errors:
        worst = max(errors, key=lambda k: abs(errors[k]))
        lines += ["", f"Worst row: {worst} ({errors[worst]:+.1f}%)."]
    missing = [(r, outcomes[r.id]) for r in usable if r.id in outcomes and r.id not in errors]
    if missing:
        lines += ["", "## Usable rows not simulated", "", "| id | why |", "| --- | --- |"]
        lines += [f"| {r.id} | {o.problem} |" for r, o in missing]
    reasons = Counter(reason_key(r.reason) for r in rows if not r.usable)
    lines += ["", "## Unusable rows by reason", "", "| rows | reason |", "| --- | --- |"]
    lines += [f"| {n} | {k} |" for k, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", nargs="*", type=Path, help="published-measurement tables (default: shared/validation)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per row (default 300)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", default="", help="simulate only rows whose id contains this")
    args = parser.parse_args()
    paths = args.csv or default_csvs()
    if not paths:
        parser.error("no CSV given and none found in shared/validation")
    rows = [row for path in paths for row in read_rows(path)]
    todo = [r for r in rows if r.usable and args.only in r.id]
    start = time.monotonic()
    outcomes = run_all(todo, args.workers, args.timeout)
    print("\n".join(report(rows, outcomes)))
    print(f"\n({len(todo)} simulations, {time.monotonic() - start:.0f} s wall, {args.workers} workers, "
          f"timeout {args.timeout:g} s per row)")


if __name__ == "__main__":
    main()
