"""Benchmark: predicted vs measured step time of real gloo runs, after calibration.

Run: python bench/validate_timing.py [--profile-dir DIR] [--worlds 2 4]
Calibrates this machine first unless a profile folder is given (about 1.5 minutes with the
FSDP2 and DeepSpeed hook measurements), then trains a 4-layer llama-like model (hidden 256,
vocab 4096, seq 128, micro-batch 4, accumulation 2) without the collective recorder, with
DDP, DDP + ZeroRedundancyOptimizer, FSDP2 and DeepSpeed ZeRO-1/2/3, and prints the measured
median step (steps 2-5) beside the simulator's prediction (3 minutes in all). Not a test:
it reports what it measures (docs/validation.md has a run).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from sim.validate.calibrate import calibrate
from sim.validate.timing import TIMING_MODEL, TIMING_RUN, predicted_vs_measured, profile_for


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile-dir")
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    folder = Path(args.profile_dir) if args.profile_dir else Path(tempfile.mkdtemp(prefix="zerosim-cal-"))
    if not args.profile_dir:
        calibrate(folder, worlds=tuple(args.worlds), model=TIMING_MODEL,
                  tokens=TIMING_RUN["seq_len"] * TIMING_RUN["micro_batch"], seq_len=TIMING_RUN["seq_len"])
    print(f"{'strategy':22s}{'world':>6s}{'measured s':>12s}{'predicted s':>13s}{'error':>8s}")
    for world in args.worlds:
        for row in predicted_vs_measured(profile_for(folder, world), world):
            print(f"{row['strategy']:22s}{world:6d}{row['measured_s']:12.4f}{row['predicted_s']:13.4f}"
                  f"{100 * row['error']:7.1f}%")


if __name__ == "__main__":
    main()
