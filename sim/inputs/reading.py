"""The one way every input file is read: scenario, model, HF config.json, hardware, ds_config.

A file must be a regular file of at most `MAX_FILE_BYTES`, UTF-8 text (a UTF-8 byte-order
mark is allowed, as editors on Windows write one), TOML or JSON that parses, nested at most
`MAX_DEPTH` tables / arrays deep, with finite numbers and integers that fit in 64 bits.
JSON objects may not repeat a key (DeepSpeed reads its config with
`dict_raise_error_on_duplicate_keys`, deepspeed/runtime/config_utils.py). Anything else is
an `InputError` naming the file, and the key where there is one, in the user's terms.
"""

from __future__ import annotations

import codecs
import json
import math
import os
import stat
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sim.core.errors import InputError

MAX_FILE_BYTES = 1 << 20     # 1 MiB: the largest bundled file is 4 KB, an HF config.json 1-5 KB
MAX_DEPTH = 32               # nested tables / arrays; real files nest 4 deep at most
MAX_INT = 2**63 - 1          # what fits in an int64 (DeepSpeed's thresholds go up to here)
MAX_STRING = 4096            # characters in one string value or key

_WIDE_BOMS = {codecs.BOM_UTF32_LE: "UTF-32", codecs.BOM_UTF32_BE: "UTF-32",
              codecs.BOM_UTF16_LE: "UTF-16", codecs.BOM_UTF16_BE: "UTF-16"}


def read_text(path: Path) -> str:
    """The text of a regular, bounded, UTF-8 file (BOM stripped)."""
    return decode(read_bytes(path), path)


def read_bytes(path: Path) -> bytes:
    """Up to MAX_FILE_BYTES of a regular file; folders, FIFOs, devices and loops refused."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise InputError(path, "", "file not found") from None
    except OSError as e:
        raise InputError(path, "", f"cannot be opened ({e.strerror or e}); allowed: a readable file") from None
    if stat.S_ISDIR(info.st_mode):
        raise InputError(path, "", "is a folder; allowed: a file")
    if not stat.S_ISREG(info.st_mode):
        raise InputError(path, "", "is not a regular file (a FIFO, socket or device); allowed: a file")
    if info.st_size > MAX_FILE_BYTES:
        raise InputError(path, "", f"is {info.st_size:,} bytes; allowed: at most {MAX_FILE_BYTES:,}")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise InputError(path, "", f"cannot be read ({e.strerror or e})") from None
    if len(data) > MAX_FILE_BYTES:
        raise InputError(path, "", f"is more than {MAX_FILE_BYTES:,} bytes; allowed: at most that")
    return data


def decode(data: bytes, path: Path | str) -> str:
    """Strict UTF-8, with or without a BOM; other encodings named in the error."""
    for bom, name in _WIDE_BOMS.items():
        if data.startswith(bom):
            raise InputError(path, "", f"is {name} text; allowed: UTF-8 (save the file as UTF-8)")
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise InputError(path, "", f"is not UTF-8 text (byte 0x{data[e.start]:02x} at line {line}, "
                         f"column {column}; Latin-1 or a binary file?); allowed: UTF-8 text") from None
    if "\x00" in text:
        raise InputError(path, "", "contains NUL characters (a binary or UTF-16 file?); allowed: UTF-8 text")
    return text


def parse_toml(text: str, path: Path | str) -> dict[str, Any]:
    """A TOML document, checked by `check_tree`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputError(path, "", f"not valid TOML ({e})") from None
    except RecursionError:
        raise InputError(path, "", f"nested too deeply; allowed: at most {MAX_DEPTH} levels") from None
    except ValueError as e:   # integer literals beyond Python's 4300-digit conversion limit
        raise InputError(path, "", f"not valid TOML ({e}); allowed: integers up to {MAX_INT}") from None
    check_tree(data, path)
    return data


def parse_json(text: str, path: Path | str) -> dict[str, Any]:
    """A JSON object, checked by `check_tree`; repeated keys refused (as DeepSpeed does)."""
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys(path))
    except InputError:
        raise
    except json.JSONDecodeError as e:
        raise InputError(path, "", f"not valid JSON ({e})") from None
    except RecursionError:
        raise InputError(path, "", f"nested too deeply; allowed: at most {MAX_DEPTH} levels") from None
    except ValueError as e:
        raise InputError(path, "", f"not valid JSON ({e}); allowed: integers up to {MAX_INT}") from None
    if not isinstance(data, dict):
        raise InputError(path, "", f"expected a JSON object at the top level, got {type(data).__name__}")
    check_tree(data, path)
    return data


def read_toml(path: Path) -> dict[str, Any]:
    return parse_toml(read_text(path), path)


def read_json(path: Path) -> dict[str, Any]:
    return parse_json(read_text(path), path)


def check_tree(data: Any, path: Path | str) -> None:
    """Depth, finite numbers, 64-bit integers and bounded strings, everywhere in a document.
    Iterative, so that no document can exhaust the interpreter's recursion."""
    for dotted, value, depth in _walk(data):
        if depth > MAX_DEPTH:
            raise InputError(path, dotted, f"nested {depth} levels deep; allowed: at most {MAX_DEPTH}")
        if isinstance(value, float) and not math.isfinite(value):
            raise InputError(path, dotted, f"{value} is not a finite number; allowed: a finite number")
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
            raise InputError(path, dotted, f"an integer of {len(str(abs(value)))} digits; allowed: "
                             f"integers up to {MAX_INT:,}")
        if isinstance(value, str) and len(value) > MAX_STRING:
            raise InputError(path, dotted, f"a string of {len(value):,} characters; allowed: at most "
                             f"{MAX_STRING:,}")


def _walk(data: Any) -> Iterator[tuple[str, Any, int]]:
    stack: list[tuple[str, Any, int]] = [("", data, 0)]
    while stack:
        dotted, value, depth = stack.pop()
        yield dotted or "(top level)", value, depth
        if isinstance(value, dict):
            for key, item in value.items():
                name = str(key) if len(str(key)) <= MAX_STRING else f"{str(key)[:40]}..."
                dotted_key = f"{dotted}.{name}" if dotted else name
                if name != key:      # an over-long key is reported as an over-long string
                    yield dotted_key, str(key), depth + 1
                    continue
                stack.append((dotted_key, item, depth + 1))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                stack.append((f"{dotted}[{i}]", item, depth + 1))


def _unique_keys(path: Path | str):  # noqa: ANN202 - a json object_pairs_hook
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise InputError(path, key, "given twice in one JSON object; allowed: each key once")
            out[key] = value
        return out
    return hook
