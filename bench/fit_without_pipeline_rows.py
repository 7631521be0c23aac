"""Benchmark: how much the DeepSpeed-pipeline rows bend the shared clock parameters.

`zerosim fit` fits one GEMM efficiency, one HBM fraction, one kernel gap and so on per
chip, shared by every row on that chip. The DeepSpeed PipelineEngine rows (BLOOM's
Megatron-DeepSpeed runs, MT-NLG: ZeRO-1 with pp > 1) run slower than the simulator says
for a reason it does not model (docs/fidelity.md, "What it still misses"). This script
runs the same fit (same parameters, priors, folds and loss) on every usable row except
those, and prints the generated table: compare its statistics and parameters with the
shipped fit's in docs/fidelity.md to see what those rows cost the others.

Run: python bench/fit_without_pipeline_rows.py [CSV ...] [--folds K] [--jobs N]
Without CSV arguments it reads shared/validation/published-*.csv next to the repository.
Not a test: with 5 folds it takes about 45 minutes on two cores (1 fold: about 8 minutes).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from published_baseline import default_csvs

from sim.engines.policies import deepspeed_pipeline
from sim.studies import fit_report as report
from sim.studies.fit import FitRow, fit, usable_rows


def is_deepspeed_pipeline(row: FitRow) -> bool:
    """A row that runs DeepSpeed's PipelineEngine (sim.engines.policies.deepspeed_pipeline)."""
    return deepspeed_pipeline(row.scenario)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csvs", nargs="*", type=Path)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    csvs = args.csvs or default_csvs()
    if not csvs:
        raise SystemExit("no published-*.csv found (../shared/validation)")
    rows = usable_rows(csvs)
    kept = [r for r in rows if not is_deepspeed_pipeline(r)]
    left = sorted(r.id for r in rows if is_deepspeed_pipeline(r))
    print(f"left out ({len(left)} DeepSpeed PipelineEngine rows): {', '.join(left)}", flush=True)
    result = fit(kept, folds=args.folds if args.folds > 1 else 0, jobs=args.jobs,
                 progress=lambda line: print(f"fit: {line}", file=sys.stderr, flush=True),
                 from_priors=True)
    df = report.table(kept, result)
    block = report.markdown(df, result, [str(c) for c in csvs])
    print(block.replace(report.BEGIN, "").replace(report.END, "").strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
