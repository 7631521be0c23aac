"""Command-line options of `zerosim calibrate` and `zerosim validate`.

Kept apart from the commands (which import torch) so that `sim.cli` can build its parser
without torch installed.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_calibrate_args(cal: argparse.ArgumentParser) -> None:
    cal.add_argument("--out", default=str(Path.home() / ".cache" / "zerosim" / "calibrated"),
                     help="folder for the profile files (default: ~/.cache/zerosim/calibrated)")
    cal.add_argument("--worlds", type=int, nargs="+", default=[2, 4], help="process counts to measure")
    cal.add_argument("--max-size-MiB", type=float, default=64.0, help="largest collective size")
    cal.add_argument("--device", help="instead: measure one device (e.g. cuda, cuda:0, cpu): GEMM efficiency "
                                      "by shape, H2D/D2H pinned and pageable, CPU Adam")
    cal.add_argument("--peak-TFLOPS", type=float, help="with --device: the dense peak to compute efficiency")


def add_validate_args(val: argparse.ArgumentParser) -> None:
    val.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    val.add_argument("--profile-dir", help="a `zerosim calibrate` folder: also predict the step times")
