"""Benchmark: did each fold of a cross-validation reach the best fit of its training rows?

Run: python bench/fold_starts.py CHECKPOINT.json [CSV ...] [--folds 5] [--jobs 2] [--groups] [--sweeps N]

Reads a finished `zerosim fit --checkpoint` file (the in-sample fit and each fold's fitted
values) and, for each fold, compares the loss its own fit ended at with the loss the
catalog's current values give on the same training rows (the same soft-L1 objective with
the GEMM-table residual, `sim.studies.fit.loss`). The catalog's values were fitted on every
row, the fold's held-out ones included, so they may not be a fold's start; but they are a
point of the fold's own objective, and where they score lower than the fold's fit, the
fold stopped in a worse basin than its training rows allow, and its held-out errors
measure where the optimiser stopped as much as how the model generalises. It also prints
each fold's held-out median |error| at the fold's values. The saved loss is the one the
fit reported; the recomputed one scores the saved values with this code, so the two agree
when it runs on the code (and the rows, `--loss-knee` and row selection) that wrote the
checkpoint, which it cannot check beyond the number of parameters. Folds: as many as the
checkpoint holds. Not a test: about 3-5 minutes on 2 cores.

With --groups it then asks where each fold stopped short: for each group of parameters
(GPU kernels; fabrics; host CPU rates and software costs; ZeRO-3's host costs alone) it puts that group alone at the
catalog's values, keeps the fold's own values for the rest, and prints the fold's loss on its
training rows and the held-out median |error| (all rows, ZeRO-3 / FSDP2 rows). A group whose
catalog values lower the fold's training loss is one where the fold's fit stopped short of
what its own rows allow; the held-out figures at those values are not a cross-validation
(the catalog saw the held-out rows) and only say how much rides on that group. About 20
minutes more on 2 cores.

With --sweeps N it runs, from each fold's saved values, the coordinate sweeps `zerosim fit
--sweeps N` runs after its trust-region fit (sim.studies.fit.sweep_rows, on the fold's own
training rows), and prints each fold's training loss and held-out errors before and after,
then the cross-validated statistics of all folds before and after (the in-sample fit is not
swept). About 10 minutes per fold and round on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

import pandas as pd
from published_baseline import default_csvs

from sim.studies.fit import SCALES, Evaluator, folds_of, from_ideal, usable_rows
from sim.studies.fit_objective import F_SCALE, loss, sweep_rows
from sim.studies.fit_params import (
    CLUSTER_BOUNDS,
    GPU_BOUNDS,
    HOST_BOUNDS,
    HOST_CPU_KEYS,
    Param,
    parameters,
    start_values,
)
from sim.studies.fit_report import engine_label, shards_parameters, stats

ZERO3_HOST = ("host.launch_us", "host.zero3_hook_us", "host.zero3_rank_piece_us")
GROUPS = {"GPU kernels": lambda p: p.key in GPU_BOUNDS,
          "fabrics": lambda p: p.key in CLUSTER_BOUNDS and p.key not in HOST_CPU_KEYS,
          "host (CPU rates, software costs)": lambda p: p.key in HOST_CPU_KEYS or p.key in HOST_BOUNDS,
          "ZeRO-3 host costs (launch, hook, slice)": lambda p: p.key in ZERO3_HOST}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("csvs", nargs="*")
    parser.add_argument("--folds", type=int, help="default: the folds the checkpoint holds")
    parser.add_argument("--loss-knee", type=float, default=F_SCALE)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--groups", action="store_true", help="also score each parameter group at the catalog's values")
    parser.add_argument("--sweeps", type=int, default=0, help="also run up to N rounds of coordinate sweeps per fold")
    parser.add_argument("--scale", choices=SCALES, default="linear", help="the sweeps' grid scale (zerosim fit --scale)")
    args = parser.parse_args()
    csvs = args.csvs or default_csvs()
    rows = usable_rows(csvs)
    params = parameters([r.scenario for r in rows])
    catalog = start_values(params, [r.scenario for r in rows])
    fits = json.loads(Path(args.checkpoint).read_text())["fits"]
    folds = args.folds or sum(1 for name in fits if re.fullmatch(r"fold \d+", name))
    print("| fit | rows | its loss (saved) | its loss (recomputed) | catalog's loss on its rows | converged "
          "| held-out median abs error |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    with Evaluator(rows, params, args.jobs) as ev:
        simulated = [i for i in range(len(rows)) if ev.simulated(i)]
        kept: list[tuple[str, list[float], list[int], list[int]]] = []
        for name, test in [("in-sample", [])] + [(f"fold {f + 1}", fold) for f, fold in
                                                 enumerate(folds_of(rows, folds))]:
            if name not in fits:
                continue
            saved = min((fits[n] for n in (name, from_ideal(name)) if n in fits),
                        key=lambda s: s.get("outcome", s)["cost"])     # --ideal-start keeps the lower loss
            outcome = saved.get("outcome", saved)   # checkpoint format 2 keeps it apart, format 1 beside the values
            values = saved["values"]
            if len(values) != len(params):
                raise SystemExit(f"{args.checkpoint}: {len(values)} values for {len(params)} parameters: "
                                 "run this on the code that wrote the checkpoint")
            train = [i for i in simulated if i not in test]
            held = [i for i in simulated if i in test]
            held_out = median_abs(list(errors_at(ev, held, values).values()))
            print(f"| {name} | {len(train)} | {outcome['cost']:.4f} | {loss(ev, train, values, args.loss_knee):.4f} "
                  f"| {loss(ev, train, catalog, args.loss_knee):.4f} "
                  f"| {outcome['converged']} | {held_out} |", flush=True)
            if test:
                kept.append((name, values, train, held))
        if args.groups:
            print_groups(ev, rows, params, catalog, kept, args.loss_knee)
        if args.sweeps:
            print_sweeps(ev, rows, kept, args.sweeps, args.loss_knee, args.scale)


def print_sweeps(ev: Evaluator, rows: list, folds: list[tuple[str, list[float], list[int], list[int]]],
                 rounds: int, knee: float, scale: str) -> None:
    """Per fold: its sweeps from the saved values; then the cross-validated figures before and after."""
    print("\n| fold | rounds | training loss before | after | held-out median abs error before | after |")
    print("| --- | --- | --- | --- | --- | --- |")
    before: dict[int, float] = {}
    after: dict[int, float] = {}
    for name, values, train, held in folds:
        x, done, cost = sweep_rows(ev, train, values, rounds, knee, scale)
        old, new = errors_at(ev, held, values), errors_at(ev, held, x)
        before.update(old)
        after.update(new)
        print(f"| {name} | {done} | {loss(ev, train, values, knee):.4f} | {cost:.4f} | "
              f"{median_abs(list(old.values()))} | {median_abs(list(new.values()))} |", flush=True)
    print("\n| cross-validated | rows | median abs | worst abs | median signed | ZeRO-3 / FSDP2 median abs | other |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for label, errors in (("saved folds", before), ("after the sweeps", after)):
        every = stats(pd.Series(errors))
        print(f"| {label} | {every['rows']} | {100 * every['median_abs']:.1f}% | {100 * every['worst_abs']:.1f}% "
              f"| {100 * every['median_signed']:+.1f}% | {median_abs(sharded_only(rows, errors, True))} "
              f"| {median_abs(sharded_only(rows, errors, False))} |")


def errors_at(ev: Evaluator, idx: list[int], x: list[float]) -> dict[int, float]:
    """Each row's (predicted - published) / published step time under `x`."""
    return {i: t / ev.rows[i].measured_s - 1 for i, t in zip(idx, ev.predict(idx, x), strict=True)}


def sharded_only(rows: list, errors: dict[int, float], sharded: bool) -> list[float]:
    """The errors of the ZeRO-3 / FSDP2 rows (`sharded`) or of the rest."""
    return [e for i, e in errors.items() if shards_parameters(engine_label(rows[i].scenario)) == sharded]


def print_groups(ev: Evaluator, rows: list, params: list[Param], catalog: list[float],
                 folds: list[tuple[str, list[float], list[int], list[int]]], knee: float) -> None:
    """Per fold and group: the fold's values with that group at the catalog's."""
    print("\n| fold | catalog values for | training loss | held-out median abs error | "
          "held-out ZeRO-3 / FSDP2 rows |")
    print("| --- | --- | --- | --- | --- |")
    for name, values, train, held in folds:
        for group, member in [("none", lambda p: False), *GROUPS.items()]:
            x = [c if member(p) else v for p, v, c in zip(params, values, catalog, strict=True)]
            errors = errors_at(ev, held, x)
            print(f"| {name} | {group} | {loss(ev, train, x, knee):.4f} | {median_abs(list(errors.values()))} "
                  f"| {median_abs(sharded_only(rows, errors, True))} |", flush=True)


def median_abs(errors: list[float]) -> str:
    return f"{100 * statistics.median(abs(e) for e in errors):.1f}%" if errors else ""


if __name__ == "__main__":
    main()
