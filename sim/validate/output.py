"""Quiet output for `zerosim calibrate` / `zerosim validate`: the command's own lines on the
terminal, everything else (torch, DeepSpeed and transformers warnings and logs, from this
process and from every rank) in one log file named at the end.

This process's file descriptors 1 and 2 are pointed at the log for the duration (os.dup2),
so that library loggers bound to sys.stdout / sys.stderr, Python warnings and C-level prints
all land there; the command writes through a stream on a duplicate of the original stdout.
The worker processes inherit the descriptors, and `torch_runs._entry` redirects them again
from the log path it is given (so a run started outside this context can be quiet too).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from sim.core.errors import InputError

LOG_DIR = Path.home() / ".cache" / "zerosim" / "logs"


def default_log(command: str) -> Path:
    """~/.cache/zerosim/logs/zerosim-<command>-<YYYYmmdd-HHMMSS>.log"""
    return LOG_DIR / f"zerosim-{command}-{_dt.datetime.now():%Y%m%d-%H%M%S}.log"


@contextlib.contextmanager
def command_output(command: str, log: str | None, verbose: bool) -> Iterator[tuple[TextIO, Path | None]]:
    """Yield (stream for the command's lines, log path or None with --verbose). On the way
    out, restore the terminal and name the log in one line (stdout; stderr after an error
    that is not an InputError, whose own one line already names what matters)."""
    if verbose:
        yield sys.stdout, None
        return
    path = Path(log) if log else default_log(command)
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    saved = os.dup(1), os.dup(2)
    terminal = open(os.dup(saved[0]), "w", buffering=1, encoding="utf-8")   # noqa: SIM115
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    # and the Python streams, in case they are not descriptors 1 and 2 (pytest's capture)
    text = open(os.dup(log_fd), "a", buffering=1, encoding="utf-8", errors="replace")   # noqa: SIM115
    failed: BaseException | None = None
    try:
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
            yield terminal, path
    except BaseException as error:
        failed = error
        raise
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        text.close()
        terminal.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, log_fd):
            os.close(fd)
        terminal.close()
        if failed is None:
            print(f"torch / DeepSpeed output: {path}", flush=True)
        elif not isinstance(failed, InputError):
            print(f"zerosim: torch / DeepSpeed output of this run: {path}", file=sys.stderr, flush=True)
