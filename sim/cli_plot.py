"""`zerosim plot SOURCE --kind KIND --out FILE`: figures of a sweep or search table (CSV or
Parquet written by `zerosim sweep` / `zerosim search`), or the per-rank timeline of one
step of a scenario (sim.results.study_plots draws them)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pandas as pd

from sim.cli_checks import CLI, check_int, check_output_path, image_suffixes, scenario_path, written
from sim.core.errors import InputError
from sim.inputs.load import load_scenario
from sim.results.study_plots import KINDS, RESULT_COLUMNS, save_table_plot, save_timeline
from sim.simulate import simulate

ALL_KINDS = (*KINDS, "timeline")


def add_plot_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="a table from `zerosim sweep --csv/--parquet` or `zerosim search --csv` "
                                  "(kinds throughput, tflops, breakdown, memory, exposed), or a scenario "
                                  "(kind timeline)")
    p.add_argument("--kind", required=True, choices=ALL_KINDS,
                   help="throughput / tflops: against GPUs, one line per --by value; breakdown: step time by "
                        "part per row; memory: peak memory by category per row; exposed: exposed "
                        "communication against tokens per GPU; timeline: one step, a lane per rank and stream")
    p.add_argument("--out", required=True, metavar="FILE", help="image to write (.png, .svg, .pdf, ...)")
    p.add_argument("--by", default="strategy", help="the column whose values are the lines (default strategy)")
    p.add_argument("--label", default=None, help="comma-separated columns that name the bars (default: the "
                                                 "varied keys)")
    p.add_argument("--ranks", type=int, default=None, help="timeline: the first N ranks simulated (default all)")


def read_table(path: str) -> pd.DataFrame:
    """A sweep / search table from CSV or Parquet, checked for the results columns."""
    source = Path(path)
    if not source.is_file():
        raise InputError(path, "source", "no such file; allowed: a CSV or Parquet table from zerosim sweep or search")
    if source.suffix == ".parquet":
        if importlib.util.find_spec("pyarrow") is None:
            raise InputError(path, "source", "a Parquet table needs pyarrow; allowed: pip install pyarrow, or a CSV")
        df = pd.read_parquet(source)
    elif source.suffix == ".csv":
        try:
            df = pd.read_csv(source)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
            raise InputError(path, "source", f"not a readable CSV table ({type(error).__name__})") from None
    else:
        raise InputError(path, "source", "allowed: a .csv or .parquet table (or a scenario with --kind timeline)")
    missing = sorted(RESULT_COLUMNS - set(df.columns))
    if missing:
        raise InputError(path, missing[0], "not a zerosim sweep or search table: the column is missing")
    return df


def cmd_plot(args: argparse.Namespace) -> int:
    out = check_output_path(args.out, "--out", image_suffixes())
    if args.kind == "timeline":
        ranks = check_int(args.ranks, "--ranks", low=1, high=1_000_000) if args.ranks is not None else None
        result = simulate(load_scenario(scenario_path(args.source)))
        chosen = sorted({sp.rank for sp in result.engine.spans})[:ranks] if ranks else None
        written(out, "--out", lambda p: save_timeline(result, str(p), chosen))
        print(f"wrote {out}")
        return 0
    df = read_table(args.source)
    if args.kind in ("throughput", "tflops", "exposed"):
        needed = {"throughput": "gpus", "tflops": "gpus", "exposed": "tokens_per_gpu"}[args.kind]
        for column in (args.by, needed):
            if column not in df.columns:
                raise InputError(args.source, column, f"--kind {args.kind} needs this column; allowed: "
                                 f"{', '.join(map(str, df.columns))}")
    columns = [c.strip() for c in args.label.split(",")] if args.label else None
    for column in columns or ():
        if column not in df.columns:
            raise InputError(CLI, "--label", f"{column!r} is not a column of {args.source}")
    written(out, "--out", lambda p: save_table_plot(df, args.kind, str(p), by=args.by, columns=columns))
    print(f"wrote {out}")
    return 0
