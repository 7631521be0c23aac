"""Benchmark: did each fold of a cross-validation reach the best fit of its training rows?

Run: python bench/fold_starts.py CHECKPOINT.json [CSV ...] [--folds 5] [--jobs 2]

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
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

from published_baseline import default_csvs

from sim.studies.fit import F_SCALE, Evaluator, folds_of, from_ideal, loss, usable_rows
from sim.studies.fit_params import parameters, start_values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("csvs", nargs="*")
    parser.add_argument("--folds", type=int, help="default: the folds the checkpoint holds")
    parser.add_argument("--loss-knee", type=float, default=F_SCALE)
    parser.add_argument("--jobs", type=int, default=2)
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
            errors = [abs(t / rows[i].measured_s - 1) for i, t in zip(held, ev.predict(held, values), strict=True)]
            held_out = f"{100 * statistics.median(errors):.1f}%" if errors else ""
            print(f"| {name} | {len(train)} | {outcome['cost']:.4f} | {loss(ev, train, values, args.loss_knee):.4f} "
                  f"| {loss(ev, train, catalog, args.loss_knee):.4f} "
                  f"| {outcome['converged']} | {held_out} |", flush=True)


if __name__ == "__main__":
    main()
