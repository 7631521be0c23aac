"""Strict reading of data-file tables: every key declared, typed, unit-converted once.

Files are read by `sim.inputs.reading` (encoding, size, depth, finite numbers); a table is
checked here against a list of `Key`s. Unknown keys, missing required keys,
wrong types and values outside the allowed set raise `InputError` naming the file,
the dotted key and what is allowed. Keys whose name ends in a unit suffix
(`sim.core.units.SUFFIX_TO_SI`) are converted to SI and stored without the suffix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.core.errors import InputError, allowed
from sim.core.units import SUFFIX_TO_SI
from sim.inputs.reading import MAX_INT

NOT_SIMULATED_YET = "not simulated yet"
_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
               dict: "a table", list: "a list"}


@dataclass(frozen=True, slots=True)
class Key:
    """One key a table may hold."""

    name: str
    kind: type
    required: bool = True
    default: Any = None
    choices: tuple[Any, ...] = ()
    positive: bool = False        # > 0
    non_negative: bool = False    # >= 0
    fraction: bool = False        # 0 < x <= 1
    maximum: float | None = None  # largest value allowed (in the file's unit); see sim.core.limits
    not_simulated: bool = False   # only the default is accepted until other values are simulated

    @property
    def field(self) -> str:
        """The SI field name: the key without its unit suffix."""
        for suffix in SUFFIX_TO_SI:
            if self.name.endswith(suffix):
                return self.name[: -len(suffix)]
        return self.name

    @property
    def si_factor(self) -> float:
        for suffix, factor in SUFFIX_TO_SI.items():
            if self.name.endswith(suffix):
                return factor
        return 1.0


def read_table(table: Mapping[str, Any], keys: Sequence[Key], source: str | Path,
               prefix: str = "") -> dict[str, Any]:
    """Check `table` against `keys`; return {field: SI value} with defaults filled in."""
    if not isinstance(table, Mapping):
        raise InputError(source, prefix.rstrip(".") or "(top level)", "expected a table")
    known = {k.name: k for k in keys}
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise InputError(source, prefix + unknown[0],
                         f"unknown key; {allowed(sorted(known))}")
    out: dict[str, Any] = {}
    for key in keys:
        dotted = prefix + key.name
        if key.name not in table:
            if key.required:
                raise InputError(source, dotted, f"missing required key; allowed: {describe(key)}")
            out[key.field] = key.default
            continue
        value = check_value(table[key.name], key, source, dotted)
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        out[key.field] = value * key.si_factor if numeric and key.si_factor != 1.0 else value
    return out


def check_value(value: Any, key: Key, source: str | Path, dotted: str) -> Any:
    """Type, range and choice check of one value; ints are accepted where numbers are."""
    value = _coerce(value, key.kind, source, dotted)
    if key.choices and value not in key.choices:
        raise InputError(source, dotted, f"{value!r} is not valid; {allowed(key.choices)}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        in_range = ((not key.positive or value > 0) and (not key.non_negative or value >= 0)
                    and (not key.fraction or 0 < value <= 1)
                    and (key.maximum is None or value <= key.maximum))
        if not in_range:
            raise InputError(source, dotted, f"got {value}; allowed: {describe(key)}")
    if key.not_simulated and value != key.default:
        raise InputError(source, dotted, f"{value!r}: {NOT_SIMULATED_YET}; allowed: its default "
                         f"({key.default!r})")
    return value


def describe(key: Key) -> str:
    """What a key accepts, in words: 'an integer > 0', 'one of a, b', 'a number in (0, 1]'."""
    if key.choices:
        return "one of " + ", ".join(str(c) for c in key.choices)
    text = _TYPE_NAMES.get(key.kind, "a catalog name, a path or a table")
    low = " > 0" if key.positive else " >= 0" if key.non_negative else ""
    if key.fraction:
        return text + " in (0, 1]"
    if key.maximum is not None:
        top = f"{key.maximum:,}" if key.kind is int else f"{key.maximum:g}"
        return text + (f"{low} and <= {top}" if low else f" <= {top}")
    return text + low


def _coerce(value: Any, kind: type, source: str | Path, dotted: str) -> Any:
    wrong = InputError(source, dotted, f"got {type(value).__name__} {value!r}; "
                                       f"allowed: {_TYPE_NAMES.get(kind, kind.__name__)}")
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong
        if abs(value) > MAX_INT or not math.isfinite(value):
            raise InputError(source, dotted, f"got {value!r}; allowed: a finite number")
        return float(value)
    if kind is int:
        if isinstance(value, bool):
            raise wrong
        if isinstance(value, float) and value.is_integer() and abs(value) <= MAX_INT:
            return int(value)      # DeepSpeed accepts 5e8 for an element count
        if not isinstance(value, int):
            raise wrong
        if abs(value) > MAX_INT:
            raise InputError(source, dotted, f"an integer of {len(str(abs(value)))} digits; allowed: "
                             f"integers up to {MAX_INT:,}")
        return value
    if kind is bool and not isinstance(value, bool):
        raise wrong
    if kind is str and not isinstance(value, str):
        raise wrong
    if kind in (dict, list) and not isinstance(value, kind):
        raise wrong
    return value
