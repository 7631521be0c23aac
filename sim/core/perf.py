"""Performance helpers that change no result."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector. Planning and the DES allocate millions of
    short-lived objects (ops, events, spans) and free them by reference counting; the
    collector's scans of the live ones cost about a third of a full-mode run (measured in
    bench/engine_speed.py). Cycles made meanwhile are collected once it is back on."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
