"""Benchmark: predicted vs measured step time of real gloo runs, after calibration.

Run: python bench/validate_timing.py [--rounds N] [--worlds 2 4] [--profile-dir DIR]

Each round calibrates this machine afresh (about 30 s per process count), then trains a
4-layer llama-like model (hidden 256, vocab 4096, seq 128, micro-batch 4, accumulation 2)
without the collective recorder, with DDP, DDP + ZeroRedundancyOptimizer, FSDP2 and
DeepSpeed ZeRO-1/2/3 (in an order rotated per round), and predicts each from that round's
profile. It prints every round's rows as they come, then per strategy the median error over
the rounds and its range, drift-adjusted (each run re-measures the machine's GEMM rate and
the profile's GEMMs are re-simulated at it; raw errors beside, and the whole step scaled by
that rate as before 2026-12-07; sim.validate.timing says why one pass is not enough on a
machine whose speed drifts), then each strategy's step over DDP's in the same round,
measured and predicted (drift between rounds cancels). About 4.5 to 9 minutes per round
for worlds 2 and 4 (9 on 2026-12-08). With --profile-dir it
runs one pass against that profile instead. Not a test: it reports what it measures
(docs/validation.md has a run).
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import platform
from pathlib import Path
from typing import Any, TextIO

from sim.validate.calibrate import calibrate
from sim.validate.output import command_output
from sim.validate.timing import (
    TIMING_MODEL,
    TIMING_RUN,
    predicted_vs_measured,
    profile_for,
    relative_to,
    summarise,
    timing_rounds,
)


def calibrate_into(folder: Path, worlds: tuple[int, ...]) -> None:
    calibrate(folder, worlds=worlds, model=TIMING_MODEL,
              tokens=TIMING_RUN["seq_len"] * TIMING_RUN["micro_batch"], seq_len=TIMING_RUN["seq_len"])


HEADER = (f"{'round':>5s}  {'strategy':22s}{'world':>6s}{'measured s':>12s}{'predicted s':>13s}{'error':>9s}"
          f"{'speed':>8s}{'adjusted s':>12s}{'error':>9s}{'scaled':>9s}")


def print_row(out: TextIO, row: dict[str, Any]) -> None:
    print(f"{row.get('round', 0):5d}  {row['strategy']:22s}{row['world']:6d}{row['measured_s']:12.4f}"
          f"{row['predicted_s']:13.4f}{100 * row['error']:8.1f}%{row['speed']:8.2f}{row['adjusted_s']:12.4f}"
          f"{100 * row['adjusted_error']:8.1f}%{100 * row['step_scaled_error']:8.1f}%"
          f"  steps {' '.join(f'{t:.3f}' for t in row['steps_s'])}", file=out, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile-dir", help="one pass against this calibrated profile folder")
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--log", help="file for the torch / DeepSpeed output (default under ~/.cache/zerosim/logs)")
    args = parser.parse_args()
    worlds = tuple(args.worlds)
    with command_output("timing", args.log, False) as (out, _):
        print(f"# {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC on {platform.node()}", file=out)
        print(HEADER, file=out)
        report = functools.partial(print_row, out)
        if args.profile_dir:
            for world in worlds:
                for row in predicted_vs_measured(profile_for(Path(args.profile_dir), world), world):
                    report(row)
            return
        rows = timing_rounds(args.rounds, worlds, calibrate_into, report=report)
        print_summary(out, summarise(rows), args.rounds)
        print_ratios(out, relative_to(rows))


def print_summary(out: TextIO, summary: list[dict[str, Any]], rounds: int) -> None:
    print("\n| strategy | world | rounds | measured s | adjusted prediction s | error | range | raw error "
          "| step-scaled error |", file=out)
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |", file=out)
    for s in summary:
        print(f"| {s['strategy']} | {s['world']} | {s['rounds']} | {s['measured_s']:.4f} | {s['predicted_s']:.4f} "
              f"| {100 * s['median_error']:+.1f}% | {100 * s['min_error']:+.1f}% .. {100 * s['max_error']:+.1f}% "
              f"| {100 * s['raw_error']:+.1f}% | {100 * s['step_scaled_error']:+.1f}% |", file=out)
    inside = sum(s["within"] for s in summary)
    print(f"\n{inside} of {len(summary)} strategies within 10% (median over {rounds} rounds)", file=out)


def print_ratios(out: TextIO, ratios: list[dict[str, Any]]) -> None:
    """Each strategy's step over DDP's in the same round (sim.validate.timing.relative_to)."""
    print("\n| strategy | world | step / DDP's, measured (range) | predicted | error of the ratio |", file=out)
    print("| --- | --- | --- | --- | --- |", file=out)
    for r in ratios:
        print(f"| {r['strategy']} | {r['world']} | {r['measured_ratio']:.2f} ({r['measured_low']:.2f}-"
              f"{r['measured_high']:.2f}) | {r['predicted_ratio']:.2f} | {100 * r['ratio_error']:+.1f}% |", file=out)


if __name__ == "__main__":
    main()
