"""`zerosim sweep SCENARIO --vary KEY=V1,V2 [--vary ...]`: arguments and the command
(sim.studies.sweep does the work). Prints the table's main columns; `--csv` / `--parquet`
write every column; a progress bar (tqdm) goes to stderr."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Iterable
from typing import Any

from sim.cli_checks import CLI, check_int, check_output_path, image_suffixes, scenario_path, written
from sim.core.errors import InputError
from sim.results.study_plots import KINDS, save_table_plot
from sim.studies.sweep import parse_vary, sweep

SHOWN = ("step_time_s", "tokens_per_s", "mfu", "peak_bytes", "bound", "fits", "reason")


def add_sweep_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="scenario TOML file, or a bundled scenario's name")
    p.add_argument("--vary", action="append", required=True, metavar="KEY=V1,V2,...",
                   help="a scenario key (dotted, as in the file: zero.stage, training.micro_batch, "
                        "parallel.tp, comm.busbw_GBps.dp, nodes) and its values; repeat for a product")
    p.add_argument("--jobs", type=int, default=None, help="worker processes (default: every core; 1: serial)")
    p.add_argument("--csv", metavar="OUT.csv", help="write the whole table as CSV")
    p.add_argument("--parquet", metavar="OUT.parquet", help="write the whole table as Parquet (needs pyarrow)")
    p.add_argument("--backend", default="joblib", choices=("joblib", "dask", "ray"),
                   help="where the points run: joblib on the local cores (default), or dask (a local "
                        "cluster, or --address's scheduler; pip install 'zerosim[dask]'); ray is not supported yet")
    p.add_argument("--address", help="with --backend dask: the scheduler to use (tcp://host:8786)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--plot", metavar="OUT.png", help="also draw the table (.png, .svg, ...): --plot-kind, "
                   "lines by strategy (sim.results.study_plots; zerosim plot draws the others from --csv)")
    p.add_argument("--plot-kind", default="throughput", choices=KINDS, help="the figure --plot draws "
                   "(default throughput: tokens/s against GPUs)")


def cmd_sweep(args: argparse.Namespace) -> int:
    if args.backend == "ray":
        raise InputError(CLI, "--backend", "'ray': not supported yet; allowed: joblib, dask")
    if args.address and args.backend != "dask":
        raise InputError(CLI, "--address", "only with --backend dask")
    jobs = check_int(args.jobs, "--jobs", low=1, high=1024) if args.jobs is not None else None
    csv = check_output_path(args.csv, "--csv", ("csv",)) if args.csv else None
    parquet = check_output_path(args.parquet, "--parquet", ("parquet",)) if args.parquet else None
    plot = check_output_path(args.plot, "--plot", image_suffixes()) if args.plot else None
    if parquet and importlib.util.find_spec("pyarrow") is None:
        raise InputError(CLI, "--parquet", "needs pyarrow; allowed: pip install pyarrow, or --csv")
    vary: dict[str, list[Any]] = {}
    for text in args.vary:
        key, values = parse_vary(text)
        if key in vary:
            raise InputError(CLI, "--vary", f"{key} given twice; allowed: each key once, with all its values")
        vary[key] = values
    path = scenario_path(args.scenario)
    table = sweep(path, vary, jobs=jobs, progress=None if args.no_progress else _bar, backend=args.backend,
                  address=args.address)
    if csv:
        written(csv, "--csv", lambda p: table.to_csv(p, index=False))
    if parquet:
        written(parquet, "--parquet", lambda p: table.to_parquet(p, index=False))
    if plot:
        written(plot, "--plot", lambda p: save_table_plot(table, args.plot_kind, str(p)))
    shown = [c for c in (*vary, *SHOWN) if c in table.columns]
    print(table[shown].to_string(index=False))
    return 0


def _bar(rows: Iterable[Any], total: int) -> Iterable[Any]:
    from tqdm import tqdm
    return tqdm(rows, total=total, desc="zerosim sweep", unit="point", file=sys.stderr, leave=False)

