"""The `[calibration]` table of a cluster file: measured collectives inside one node.

Per collective (`all_reduce`, `all_gather`, `reduce_scatter`, `broadcast`, `reduce`) either

- `<op>_alpha_us` and `<op>_busbw_GBps`, an alpha-beta line: t = alpha x ring steps(op, n)
  + S x factor(op, n) / busbw (sim.analytic.opcost), or
- `<op>_busbw_curve = [[size_bytes, busbw_GBps], ...]`, a measured curve as nccl-tests
  prints it (its `size` and `busbw` columns, doc/PERFORMANCE.md: busbw = S / t x factor(op,
  n)): t(S) = S x factor(op, n) / busbw(S), busbw interpolated linearly in log(size) between
  the measured sizes; below the smallest size the time of the smallest (a latency floor),
  above the largest its bus bandwidth (sim.analytic.opcost.curve_busbw).

A curve keeps what a line cannot: on this 2-core machine a 1 KiB all-gather on 4 gloo
processes takes as long as a 256 KiB one (about 1-4 ms, docs/validation.md). Giving both
forms for one op, or half a line, is refused: each key that is accepted is used.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sim.core.errors import InputError
from sim.core.specs import Curve
from sim.core.units import GB
from sim.inputs.schema import Key, check_value, read_table

CALIBRATED_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
CALIBRATION_KEYS = tuple(k for op in CALIBRATED_OPS for k in (
    Key(f"{op}_alpha_us", float, required=False, default=None, non_negative=True),
    Key(f"{op}_busbw_GBps", float, required=False, default=None, positive=True),
    Key(f"{op}_busbw_curve", list, required=False, default=None)))
MAX_CURVE_POINTS = 1000


def read_calibration(table: Mapping[str, Any], source: str | Path, prefix: str,
                     ) -> tuple[dict[str, tuple[float, float]], dict[str, Curve]]:
    """(op -> (alpha per step in s, busbw in B/s), op -> curve) of a `[calibration]` table."""
    cal = read_table(table, CALIBRATION_KEYS, source, prefix)
    lines: dict[str, tuple[float, float]] = {}
    curves: dict[str, Curve] = {}
    for op in CALIBRATED_OPS:
        alpha, busbw, curve = cal[f"{op}_alpha"], cal[f"{op}_busbw"], cal[f"{op}_busbw_curve"]
        if (alpha is None) != (busbw is None):
            alpha_key, busbw_key = f"{op}_alpha_us", f"{op}_busbw_GBps"
            given, missing = (alpha_key, busbw_key) if busbw is None else (busbw_key, alpha_key)
            raise InputError(source, prefix + given, f"an alpha-beta line needs both keys; add {prefix}{missing}")
        if curve is not None and alpha is not None:
            raise InputError(source, prefix + f"{op}_busbw_curve",
                             f"give either {op}_busbw_curve or {op}_alpha_us and {op}_busbw_GBps, not both")
        if curve is not None:
            curves[op] = _curve(curve, source, prefix + f"{op}_busbw_curve")
        elif alpha is not None:
            lines[op] = (alpha, busbw)
    return lines, curves


def _curve(points: list[Any], source: str | Path, dotted: str) -> Curve:
    """Check [[size_bytes, busbw_GBps], ...]: 2 to MAX_CURVE_POINTS pairs of positive numbers,
    sizes strictly increasing; return it in bytes and B/s."""
    if not 2 <= len(points) <= MAX_CURVE_POINTS:
        raise InputError(source, dotted, f"{len(points)} points; allowed: 2 to {MAX_CURVE_POINTS} "
                                         "[size_bytes, busbw_GBps] pairs")
    out: list[tuple[float, float]] = []
    for i, point in enumerate(points):
        where = f"{dotted}[{i}]"
        if not isinstance(point, list) or len(point) != 2:
            raise InputError(source, where, f"got {point!r}; allowed: a pair [size_bytes, busbw_GBps]")
        size = check_value(point[0], Key("size_bytes", float, positive=True), source, where + "[0]")
        busbw = check_value(point[1], Key("busbw_GBps", float, positive=True), source, where + "[1]")
        if out and size <= out[-1][0]:
            raise InputError(source, where + "[0]", f"size {size:g} after {out[-1][0]:g}; "
                                                    "allowed: sizes in increasing order")
        out.append((size, busbw * GB))
    return tuple(out)

