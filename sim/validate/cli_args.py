"""Command-line options of `zerosim calibrate` and `zerosim validate`.

Kept apart from the commands (which import torch) so that `sim.cli` can build its parser
without torch installed. The values are checked in sim.validate.checks before any run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_TIMEOUT_S = 300.0   # as sim.validate.torch_runs.DEFAULT_TIMEOUT_S (this module imports no torch)


def add_calibrate_args(cal: argparse.ArgumentParser) -> None:
    cal.add_argument("--out", default=str(Path.home() / ".cache" / "zerosim" / "calibrated"),
                     help="folder for the profile files (default: ~/.cache/zerosim/calibrated)")
    cal.add_argument("--worlds", type=int, nargs="+", default=[2, 4],
                     help="process counts to measure, each 2 to 8 (gloo processes on this machine)")
    cal.add_argument("--max-size-MiB", type=float, default=64.0,
                     help="largest collective size, 1/256 to 1024 "
                          "(sizes 1 KiB x 4^k up to this, at most 64 MiB; default 64)")
    cal.add_argument("--device", help="instead: measure one device (cpu, cuda or cuda:N): GEMM efficiency "
                                      "by shape, H2D/D2H pinned and pageable, CPU Adam")
    cal.add_argument("--peak-TFLOPS", type=float, help="with --device: the dense peak to compute efficiency")
    cal.add_argument("--check", action="store_true",
                     help="with --device: also the device check (GEMM shape sweep, sustained GEMM with clocks, "
                          "attention by sequence length, memory-bound kernels, launch gaps, plain / FSDP2 / "
                          "ZeRO-3 steps of a small Llama; about 3 minutes on an H100; tiny sizes on a CPU, which "
                          "tests the path), into device-check-DEV.json")
    cal.add_argument("--sustain-s", type=float, default=30.0,
                     help="with --check: seconds of back-to-back GEMMs for the sustained rate (default 30)")
    _add_run_args(cal)


def add_validate_args(val: argparse.ArgumentParser) -> None:
    val.add_argument("--worlds", type=int, nargs="+", default=[2, 4],
                     help="process counts to run, each 2 to 8 (gloo processes on this machine)")
    val.add_argument("--profile-dir", help="a `zerosim calibrate` folder: also predict the step times")
    _add_run_args(val)


def _add_run_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help=f"stop a torch run that has not finished after this long (default {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--log", metavar="PATH", help="write torch / DeepSpeed output here (default: "
                                                      "~/.cache/zerosim/logs/zerosim-<command>-<time>.log)")
    parser.add_argument("--verbose", action="store_true",
                        help="show torch / DeepSpeed output from every process instead of writing a log")
