"""`zerosim fit CSV [CSV ...]`: arguments and the command (sim.studies.fit does the work).

Reads published-measurement CSVs (shared/validation/README.md formats, via
sim.studies.published), fits the physical clock parameters on the usable rows with k-fold
cross-validation, prints the error statistics and parameters, and on request writes the
fitted hardware files, the per-row table, a scatter plot and the generated block of a
markdown file (docs/fidelity.md).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from sim.cli_checks import (
    CLI,
    check_int,
    check_number,
    check_output_path,
    comma_choices,
    image_suffixes,
    strict_json,
    written,
)
from sim.core.errors import InputError
from sim.inputs.catalog import catalog_dir
from sim.studies import fit_report as report
from sim.studies.fit import F_SCALE, MAX_ITERATIONS, SCALES, SOLVERS, FitRow, fit, usable_rows
from sim.studies.fit_params import CLUSTER_BOUNDS, GPU_BOUNDS, HOST_BOUNDS, write_files

KEYS = (*GPU_BOUNDS, *CLUSTER_BOUNDS, *HOST_BOUNDS)


def add_fit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("csvs", nargs="+", metavar="CSV", help="published-measurement CSV files")
    p.add_argument("--folds", type=int, default=5, help="cross-validation folds (default 5; 1: none)")
    p.add_argument("--jobs", type=int, default=2, help="simulations run at once (default 2)")
    p.add_argument("--iterations", type=int, default=MAX_ITERATIONS,
                   help=f"trust-region iterations per fit (default {MAX_ITERATIONS})")
    p.add_argument("--loss-knee", type=float, default=F_SCALE,
                   help=f"log error beyond which a row's residual counts linearly, not squared (soft-L1; default {F_SCALE})")
    p.add_argument("--params", default="", help=f"comma-separated keys to fit (default all): {', '.join(KEYS)}")
    p.add_argument("--only", default="", help="comma-separated row ids to use (default all usable rows)")
    p.add_argument("--write-hardware", metavar="DIR", help="write the catalog hardware files with the "
                   "fitted values into DIR (DIR = the catalog's hardware folder ships them)")
    p.add_argument("--csv", metavar="OUT.csv", help="write the per-row table")
    p.add_argument("--plot", metavar="OUT.png", help="draw predicted vs published (.png, .svg, ...)")
    p.add_argument("--doc", metavar="FILE.md", help="replace the generated block of this markdown file")
    p.add_argument("--from-priors", action="store_true", help="start the in-sample fit, like the folds, from the "
                   "priors the catalog's fitted keys keep in their comments ('prior V: source') instead of "
                   "their current values")
    p.add_argument("--checkpoint", metavar="FILE.json", help="save each finished fit (in-sample, each fold) to this "
                   "file, and take the fits it holds when it was written by a fit of the same code, rows and "
                   "options: a long cross-validation can be stopped and resumed")
    p.add_argument("--solver", default="subspace", choices=SOLVERS, help="how each trust-region step is solved: subspace "
                   "(scipy's sparse LSMR in a 2-D subspace, every shipped fit so far) or exact (a dense Jacobian "
                   "differenced in one batch, SVD steps; docs/fidelity.md compares the two)")
    p.add_argument("--scale", default="linear", choices=SCALES, help="how each parameter's range maps onto the "
                   "solver's [0, 1]: linear (every shipped fit so far) or log for ranges of a decade or more "
                   "(hook and launch costs, fabric halving distances, CPU rates)")
    p.add_argument("--ideal-start", action="store_true", help="run every fit a second time from the ideal machine "
                   "(host-software costs at their floors, fabrics and host CPUs at their ceilings) and keep the "
                   "start that ends at the lower loss on the fit's own rows (twice the time)")
    p.add_argument("--sweeps", type=int, default=0, help="after each trust-region fit, up to N rounds of coordinate "
                   "sweeps (each free parameter tried at 5 points of its range; the lowest loss on the fit's own rows "
                   "kept where it gains at least 0.1%%; default 0)")
    p.add_argument("--json", action="store_true", help="print statistics, parameters and rows as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def _rows(args: argparse.Namespace) -> list[FitRow]:
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    rows = [r for r in usable_rows(args.csvs) if not only or r.id in only]
    unknown = only - {r.id for r in rows}
    if unknown:
        raise InputError(CLI, "--only", f"{', '.join(sorted(unknown))}: no usable row with that id")
    if not rows:
        raise InputError(args.csvs[0], "rows", "no usable row (a scenario and a measured step time); "
                         "see bench/published_baseline.py for the reasons")
    return rows


def _nulls(obj: Any) -> Any:
    """NaN (a row not simulated) becomes null: JSON has no NaN."""
    if isinstance(obj, dict):
        return {k: _nulls(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_nulls(v) for v in obj]
    if isinstance(obj, float) and math.isnan(obj):
        return None
    return obj


def cmd_fit(args: argparse.Namespace) -> int:
    folds = check_int(args.folds, "--folds", low=1, high=50)
    jobs = check_int(args.jobs, "--jobs", low=1, high=256)
    iterations = check_int(args.iterations, "--iterations", low=1, high=100)
    sweeps = check_int(args.sweeps, "--sweeps", low=0, high=20)
    knee = check_number(args.loss_knee, "--loss-knee", low=0.0, high=1.0, low_open=True)
    params = comma_choices(args.params, "--params", KEYS, "parameter")
    csv_out = check_output_path(args.csv, "--csv", ("csv",)) if args.csv else None
    plot_out = check_output_path(args.plot, "--plot", image_suffixes()) if args.plot else None
    doc = check_output_path(args.doc, "--doc", ("md",)) if args.doc else None
    checkpoint = check_output_path(args.checkpoint, "--checkpoint", ("json",)) if args.checkpoint else None
    hw_out = Path(args.write_hardware) if args.write_hardware else None
    if hw_out is not None and not hw_out.is_dir():
        raise InputError(CLI, "--write-hardware", f"{args.write_hardware!r} is not a folder; allowed: an existing folder")
    rows = _rows(args)
    progress = None if args.quiet else (lambda line: print(f"zerosim fit: {line}", file=sys.stderr, flush=True))
    result = fit(rows, folds=folds if folds > 1 else 0, jobs=jobs, only=params, iterations=iterations,
                 progress=progress, from_priors=args.from_priors, knee=knee, checkpoint=checkpoint,
                 solver=args.solver, scale=args.scale, ideal=args.ideal_start, sweeps=sweeps)
    df = report.table(rows, result)
    stats = report.summary(df)
    if csv_out:
        written(csv_out, "--csv", lambda p: df.to_csv(p, index=False))
    if plot_out:
        written(plot_out, "--plot", lambda p: report.plot(df, p))
    if doc:
        text = doc.read_text() if doc.exists() else ""
        written(doc, "--doc", lambda p: p.write_text(report.replace_block(text, report.markdown(df, result, args.csvs))))
    if hw_out is not None:
        n = len(df)
        cv = stats["all"]["cross_validated"]
        note = (f"zerosim fit on {n} published rows ({', '.join(Path(c).name for c in args.csvs)}); "
                f"CV median |err| {100 * cv['median_abs']:.1f}%" if folds > 1 else f"zerosim fit on {n} published rows")
        written(hw_out, "--write-hardware",
                lambda p: write_files(result.params, result.values, catalog_dir("hardware"), p,
                                      lambda param: f"{note} (docs/fidelity.md); bounds {param.low:g}-{param.high:g}"))
    if args.json:
        out = {"stats": stats, "params": report.params_table(result), "rows": df.to_dict(orient="records"),
               "simulations": result.simulations, "fits": report.outcomes_table(result)}
        print(strict_json(_nulls(out), CLI, indent=2))
    else:
        print(report.markdown(df, result, args.csvs).replace(report.BEGIN, "").replace(report.END, "").strip())
    return 0
