"""Command-line values checked before any work: numbers with units, output paths, JSON out.

Every problem is an `InputError("command line", flag, ...)`: one line on stderr, exit 2,
and nothing printed or written before it (design.md, results contract).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from sim.core.errors import InputError, allowed
from sim.inputs.catalog import looks_like_path, resolve

CLI = "command line"
_NUMBER = re.compile(r"^\s*((?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")
SIZE_UNITS = {"": 1.0, "B": 1.0, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
              "KIB": 2.0**10, "MIB": 2.0**20, "GIB": 2.0**30, "TIB": 2.0**40}
COUNT_UNITS = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
MAX_PARAMS = 1e15            # a quadrillion parameters; the largest trained models have ~2e12
MAX_DEVICE_MEMORY = 1e15     # a petabyte per device
MAX_K = 1000.0               # optimizer bytes per parameter (Adam: 12)


def parse_quantity(text: str, units: dict[str, float], flag: str, *, maximum: float) -> float:
    """'32GB' -> 3.2e10, '7.5B' -> 7.5e9: a finite number > 0 and <= maximum, with an
    optional unit; anything else names the flag."""
    match = _NUMBER.match(text)
    unit = match.group(2).upper() if match else None
    if not match or unit not in units:
        raise InputError(CLI, flag, f"cannot read {text!r}; allowed: a number with an optional unit, "
                         f"{', '.join(k for k in units if k)}")
    value = float(match.group(1)) * units[unit]
    if not 0 < value <= maximum:
        raise InputError(CLI, flag, f"{text!r} is {value:g}; allowed: > 0 and <= {maximum:g}")
    return value


def check_number(value: float, flag: str, *, low: float, high: float, low_open: bool = False,
                 high_open: bool = False) -> float:
    """A finite float flag inside [low, high] (or open ends)."""
    above = value > low if low_open else value >= low
    below = value < high if high_open else value <= high
    if not (math.isfinite(value) and above and below):
        span = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise InputError(CLI, flag, f"got {value}; allowed: a number in {span}")
    return value


def check_int(value: int, flag: str, *, low: int, high: int) -> int:
    if not low <= value <= high:
        raise InputError(CLI, flag, f"got {value}; allowed: an integer in {low}..{high:,}")
    return value


def check_output_path(text: str, flag: str, suffixes: tuple[str, ...] = ()) -> Path:
    """An output file that can be written: its folder exists and is writable, the path is
    not a folder, and its suffix is one of `suffixes` (when given)."""
    path = Path(text)
    if suffixes and path.suffix.lower().lstrip(".") not in suffixes:
        raise InputError(CLI, flag, f"{text!r} has an unknown file type {path.suffix or '(none)'!r}; "
                         f"{allowed('.' + s for s in suffixes)}")
    if path.is_dir():
        raise InputError(CLI, flag, f"{text!r} is a folder; allowed: a file path")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise InputError(CLI, flag, f"folder {str(folder)!r} does not exist; allowed: a path in an existing folder")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise InputError(CLI, flag, f"{text!r} cannot be written (permission denied)")
    return path


def image_suffixes() -> tuple[str, ...]:
    """The file types matplotlib can write (png, pdf, svg, ...)."""
    from matplotlib.backend_bases import FigureCanvasBase
    return tuple(sorted(FigureCanvasBase.get_supported_filetypes()))


def written(path: Path, flag: str, write: Any) -> None:
    """Run `write(path)`; an OS error becomes an InputError naming the flag."""
    try:
        write(path)
    except OSError as e:
        raise InputError(CLI, flag, f"{str(path)!r} could not be written ({e.strerror or e})") from None


def strict_json(obj: Any, source: str | Path, **kw: Any) -> str:
    """JSON with finite numbers only (never NaN or Infinity, which are not JSON)."""
    check_finite(obj, source)
    return json.dumps(obj, allow_nan=False, **kw)


def check_finite(obj: Any, source: str | Path) -> None:
    """A result with a non-finite number means inputs outside any physical range."""
    for where, value in _numbers(obj, ""):
        if not math.isfinite(value):
            raise InputError(source, where or "(result)", f"the result is {value}: some rate or size in the "
                             "inputs is outside any physical range; allowed: realistic hardware and model values")


def _numbers(obj: Any, where: str) -> Iterator[tuple[str, float]]:
    stack = [(where, obj)]
    while stack:
        here, value = stack.pop()
        if isinstance(value, float):
            yield here, value
        elif isinstance(value, dict):
            stack.extend((f"{here}.{k}" if here else str(k), v) for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            stack.extend((f"{here}[{i}]", v) for i, v in enumerate(value))


def scenario_path(arg: str) -> Path:
    """A scenario file path, or the name of a bundled scenario (`zerosim catalog scenarios`)."""
    if looks_like_path(arg):
        return Path(arg)
    return resolve(arg, "scenarios", Path.cwd(), CLI, "scenario")


def comma_choices(text: str, flag: str, allowed: Sequence[str], what: str = "value") -> list[str]:
    """A comma-separated option, each item one of `allowed` (else an InputError naming the flag)."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    for item in items:
        if item not in allowed:
            raise InputError(CLI, flag, f"unknown {what} {item!r}; allowed: {', '.join(allowed)}")
    return items
