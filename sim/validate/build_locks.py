"""Stale build locks of torch's just-in-time C++ extensions, which make DeepSpeed wait forever.

DeepSpeed builds some ops (cpu_adam, deepspeed_shm_comm, ...) on first use through
torch.utils.cpp_extension.load, which serialises builds with a `lock` file in the op's
build folder (torch/utils/cpp_extension.py `_jit_compile`: FileBaton(build_directory/lock);
torch/utils/file_baton.py). The builder creates the file with O_CREAT | O_EXCL, keeps that
file descriptor open for the whole build and removes the file in a `finally`; every other
process polls until the file is gone (`FileBaton.wait`, no time limit). A build killed
without running its `finally` (SIGKILL, a killed job, a machine reset) leaves the file, and
every later process that loads the op waits forever.

The rule used here: a lock is stale when no process has it open. The builder holds it open
from the moment it exists until just before it is removed, so "no holder" means "nobody
will ever remove it" (Linux: /proc/<pid>/fd). Where /proc cannot be read (not Linux), a
lock older than `STALE_AFTER_S` (10 minutes: DeepSpeed's cpu_adam builds in about a minute
on 2 cores) counts as stale. A build running on another machine that shares the folder is
not visible through /proc; such setups should set TORCH_EXTENSIONS_DIR per machine.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from sim.core.errors import InputError

STALE_AFTER_S = 600.0


def extensions_root() -> Path:
    """The folder holding one build folder per op, as torch computes it
    (torch/utils/cpp_extension.py `_get_build_directory`, without creating anything)."""
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    if env is not None:
        return Path(env)
    import torch
    from torch.utils.cpp_extension import get_default_build_root

    if torch.version.hip is not None:
        accelerator = f"rocm{torch.version.hip.replace('.', '')}"
    elif torch.version.cuda is not None:
        accelerator = f"cu{torch.version.cuda.replace('.', '')}"
    else:
        accelerator = "cpu"
    python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    return Path(get_default_build_root()) / f"{python}_{accelerator}"


def _holders(lock: Path) -> set[int] | None:
    """Ids of the processes that have `lock` open, or None where /proc cannot tell."""
    proc = Path("/proc")
    if not (proc / "self" / "fd").is_dir():
        return None
    target = os.path.realpath(lock)
    holders = set()
    for pid in (p for p in proc.iterdir() if p.name.isdigit()):
        try:
            fds = list((pid / "fd").iterdir())
        except OSError:   # gone, or another user's process (build folders are per user)
            continue
        for fd in fds:
            try:
                if os.readlink(fd) == target:
                    holders.add(int(pid.name))
                    break
            except OSError:
                continue
    return holders


def stale_reason(lock: Path, now: float | None = None) -> str | None:
    """Why `lock` is stale ("no process has it open", or without /proc "older than 10
    minutes"), or None while a build may still remove it."""
    try:
        age = (now or time.time()) - lock.stat().st_mtime
    except FileNotFoundError:
        return None
    holders = _holders(lock)
    if holders is None:
        return f"it is {age / 60:.0f} minutes old" if age > STALE_AFTER_S else None
    if holders or not lock.exists():   # held, or released between the two looks
        return None
    return "no process has it open"


def stale_build_locks(root: Path | None = None) -> list[tuple[Path, str]]:
    """(lock, why stale) for every op's build folder under the extensions root."""
    root = extensions_root() if root is None else root
    if not root.is_dir():
        return []
    found = ((lock, stale_reason(lock)) for lock in sorted(root.glob("*/lock")))
    return [(lock, why) for lock, why in found if why is not None]


def check_build_locks(root: Path | None = None) -> None:
    """Refuse to start runs that import DeepSpeed while a stale build lock would hang them."""
    locks = stale_build_locks(root)
    if locks:
        raise InputError(locks[0][0], "", stale_lock_problem(locks))


def stale_lock_problem(locks: list[tuple[Path, str]]) -> str:
    """The one-line explanation for the first lock (and the paths of any others)."""
    more = f"; also {', '.join(str(p) for p, _ in locks[1:])}" if len(locks) > 1 else ""
    return (f"stale build lock from an interrupted torch extension build ({locks[0][1]}): DeepSpeed "
            f"waits forever for it to go; no build is running, so remove it and run again{more}")
