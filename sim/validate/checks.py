"""The options of `zerosim calibrate` and `zerosim validate`, checked before any work starts
(a bad flag must not cost minutes of torch runs first). Each problem is an InputError
naming the flag; argparse has already turned the values into ints and floats.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from pathlib import Path

from sim.core.errors import InputError

WORLDS = range(2, 9)   # gloo processes on this one machine: 2 to 8
MAX_SIZE_MIB = (2.0**-8, 1024.0)   # at least 1 KiB and 4 KiB: two sizes for the two-parameter fit
_CUDA = re.compile(r"^cuda(:(\d+))?$")


def check_calibrate_args(args: argparse.Namespace) -> None:
    """calibrate: --worlds, --max-size-MiB, --device, --peak-TFLOPS, --check, --sustain-s, --out, --timeout, --log."""
    _worlds(args.worlds)
    low, high = MAX_SIZE_MIB
    if not (math.isfinite(args.max_size_MiB) and low <= args.max_size_MiB <= high):
        raise InputError("command line", "--max-size-MiB", f"got {args.max_size_MiB:g}; allowed: a number of MiB "
                         f"from {low:g} (4 KiB: at least two sizes to fit alpha and bandwidth) to {high:g}")
    if args.device is not None:
        _device(args.device)
    if args.peak_TFLOPS is not None:
        if args.device is None:
            raise InputError("command line", "--peak-TFLOPS", "only with --device (the device's dense peak)")
        _positive("--peak-TFLOPS", args.peak_TFLOPS)
    if args.check and args.device is None:
        raise InputError("command line", "--check", "only with --device (the device to check)")
    if not (math.isfinite(args.sustain_s) and 1.0 <= args.sustain_s <= 120.0):
        raise InputError("command line", "--sustain-s", f"got {args.sustain_s:g}; allowed: 1 to 120 seconds")
    _folder("--out", Path(args.out))
    _common(args)


def check_validate_args(args: argparse.Namespace) -> None:
    """validate: --worlds, --profile-dir (the profile of every world, readable), --timeout, --log."""
    _worlds(args.worlds)
    if args.profile_dir is not None:
        _profiles(Path(args.profile_dir), args.worlds)
    _common(args)


def _common(args: argparse.Namespace) -> None:
    _positive("--timeout", args.timeout)
    if args.log is not None:
        if args.verbose:
            raise InputError("command line", "--log", "not with --verbose (which shows the output instead)")
        log = Path(args.log)
        if log.is_dir():
            raise InputError("command line", "--log", f"got {log}, a folder; allowed: a file path")
        _folder("--log", log.parent, log)


def _worlds(worlds: list[int]) -> None:
    for world in worlds:
        if world not in WORLDS:
            raise InputError("command line", "--worlds", f"got {world}; allowed: {WORLDS.start} to "
                             f"{WORLDS.stop - 1} processes (gloo processes sharing this one machine)")


def _positive(flag: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise InputError("command line", flag, f"got {value:g}; allowed: a finite number > 0")


def _device(device: str) -> None:
    match = _CUDA.match(device)
    if device != "cpu" and not match:
        raise InputError("command line", "--device", f"got {device!r}; allowed: cpu, cuda, cuda:N (N = 0, 1, ...)")
    if match:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise InputError("command line", "--device", f"got {device!r}, but torch sees no CUDA device here "
                             f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); allowed: cpu")
        if match.group(2) is not None and int(match.group(2)) >= count:
            raise InputError("command line", "--device", f"got {device!r}; allowed: cpu, cuda, cuda:0 to "
                             f"cuda:{count - 1} ({count} CUDA device{'s' if count > 1 else ''} here)")


def _folder(flag: str, folder: Path, file: Path | None = None) -> None:
    """A folder that exists, or whose nearest existing parent is a folder we may write in
    (`file`: the file to be written there, for the message)."""
    target = file or folder
    if folder.exists():
        if not folder.is_dir():
            if file is not None:
                raise InputError("command line", flag, f"cannot create {file}: {folder} is a file")
            raise InputError("command line", flag, f"{folder} is a file; allowed: a folder (existing or new)")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise InputError("command line", flag, f"cannot write {target}: no permission to write in {folder}")
        return
    parent = next(p for p in folder.absolute().parents if p.exists())
    if not parent.is_dir():
        raise InputError("command line", flag, f"cannot create {target}: {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError("command line", flag, f"cannot create {target}: no permission to write in {parent}")


def _profiles(folder: Path, worlds: list[int]) -> None:
    """The calibrated cluster file of each world (and the GPU file it names) must load."""
    from sim.inputs.hardware import load_cluster
    from sim.validate.timing import profile_for

    if not folder.is_dir():
        raise InputError("command line", "--profile-dir", f"{folder} is not a folder; allowed: a folder written "
                         "by `zerosim calibrate --out`")
    for world in worlds:
        path = profile_for(folder, world)
        if not path.is_file():
            have = sorted(p.name for p in folder.glob("local-cpu-calibrated-w*.toml"))
            raise InputError("command line", "--profile-dir", f"{folder} has no profile for {world} processes "
                             f"({path.name}; it has: {', '.join(have) or 'none'}); run "
                             f"`zerosim calibrate --worlds {world} --out {folder}` first")
        load_cluster(path)   # an InputError naming the file and key if it cannot be used

