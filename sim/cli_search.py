"""`zerosim search SCENARIO`: arguments and the command (sim.studies.search does the work).
Prints the best layouts ranked and a count of the rejected ones by reason; `--json` one
object with both tables; `--csv` every candidate (ranked first, then rejected, each with
its reason); progress lines on stderr."""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from typing import Any

import pandas as pd

from sim.cli_checks import CLI, check_int, check_output_path, comma_choices, scenario_path, strict_json, written
from sim.inputs.zero_config import BLOCKING_OFFLOAD_VERSION, CURRENT_VERSION, DEEPSPEED_VERSIONS, LEGACY_VERSION
from sim.studies.search import RECOMPUTE, STRATEGIES, search

SHOWN = ("rank", "strategy", "tp", "pp", "virtual_stages", "end_stage_layers", "dp", "micro_batch", "recompute", "step_time_s", "tokens_per_s", "mfu",
         "peak_bytes", "exposed_comm_s", "bubble_s", "bound")


def add_search_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="scenario TOML (its model, cluster, nodes, sequence length, global batch and "
                                    "precision are kept; layout, micro-batch, recomputation and engine are searched)")
    p.add_argument("--top", type=int, default=10, help="layouts to rank (default 10)")
    p.add_argument("--max-simulations", type=int, default=64, help="DES runs at most (default 64)")
    p.add_argument("--strategies", default=",".join(STRATEGIES),
                   help=f"comma-separated engines to consider (default all: {', '.join(STRATEGIES)})")
    p.add_argument("--recompute", default=",".join(RECOMPUTE),
                   help="comma-separated recomputation settings to consider (default: none, selective, full)")
    p.add_argument("--deepspeed-version", choices=DEEPSPEED_VERSIONS,
                   help="the DeepSpeed release whose ZeRO-3 the 'deepspeed z3' layouts run (default: the scenario's "
                        f"[zero] deepspeed_version, else {CURRENT_VERSION}); {BLOCKING_OFFLOAD_VERSION}: v0.6.0-v0.19.4; "
                        f"{LEGACY_VERSION}: the 2021 engine (v0.3.13-v0.5.4) SC21 measured")
    p.add_argument("--json", action="store_true", help="print the ranked and rejected layouts as one JSON object")
    p.add_argument("--csv", metavar="OUT.csv", help="write every candidate, ranked then rejected")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def cmd_search(args: argparse.Namespace) -> int:
    top = check_int(args.top, "--top", low=1, high=10_000)
    budget = check_int(args.max_simulations, "--max-simulations", low=1, high=100_000)
    strategies = comma_choices(args.strategies, "--strategies", tuple(STRATEGIES), "engine")
    recompute = comma_choices(args.recompute, "--recompute", RECOMPUTE, "setting")
    csv = check_output_path(args.csv, "--csv", ("csv",)) if args.csv else None
    progress = None if args.quiet else (lambda line: print(f"zerosim search: {line}", file=sys.stderr, flush=True))
    ranked, rejected = search(scenario_path(args.scenario), top=top, max_simulations=budget,
                              strategies=strategies, recompute=recompute, progress=progress,
                              deepspeed_version=args.deepspeed_version)
    if csv:
        both = pd.concat([ranked.assign(reason=""), rejected], ignore_index=True)
        written(csv, "--csv", lambda p: both.to_csv(p, index=False))
    if args.json:
        print(strict_json({"ranked": _records(ranked.head(top)), "rejected": _records(rejected)}, CLI, indent=2))
        return 0
    shown = [c for c in SHOWN if c in ranked.columns]
    print(ranked.head(top)[shown].to_string(index=False) if not ranked.empty else "no layout fits")
    print(f"\n{len(rejected)} layouts rejected:")
    for reason, n in Counter(_kind(r) for r in rejected["reason"]).most_common() if not rejected.empty else ():
        print(f"  {n:6d}  {reason}")
    return 0


def _kind(reason: str) -> str:
    """A reason without its numbers (for the summary)."""
    return reason.split(":")[0]


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    out = []
    for row in df.to_dict(orient="records"):
        out.append({str(k): (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()})
    return out
