"""Where the bundled catalogs live, and how a name or a path becomes a file.

In a source checkout the catalogs are the top-level folders `models/`, `hardware/`
and `scenarios/`; in an installed wheel they are shipped as `sim/catalog/<kind>/`
(pyproject.toml maps them there). A reference is a catalog name (`llama2-7b`) or a
path; paths are relative to the file that names them (or to the working directory
for command-line arguments).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from sim.core.errors import InputError

_PACKAGE = Path(__file__).resolve().parent.parent   # the `sim` package
KINDS = ("models", "hardware", "scenarios")


def catalog_dir(kind: str) -> Path:
    """The folder holding the bundled `kind` catalog ('models', 'hardware', 'scenarios')."""
    installed = _PACKAGE / "catalog" / kind
    return installed if installed.is_dir() else _PACKAGE.parent / kind


def catalog_names(kind: str) -> list[str]:
    """Names usable as catalog references, e.g. ['dgx-a100-80g', ...]."""
    root = catalog_dir(kind)
    names = [p.stem for p in root.glob("*.toml")]
    if kind == "models":
        names += [p.stem for p in (root / "hf").glob("*.json")]
    return sorted(names)


def looks_like_path(ref: str) -> bool:
    return "/" in ref or ref.endswith((".toml", ".json"))


def resolve(ref: str, kind: str, base_dir: Path, source: str | Path, key: str) -> Path:
    """Turn a catalog name or a path into an existing file, or raise InputError."""
    if looks_like_path(ref):
        path = (base_dir / ref) if not Path(ref).is_absolute() else Path(ref)
        try:
            info = os.stat(path)
        except FileNotFoundError:
            raise InputError(source, key, f"file {ref!r} not found (relative to {base_dir})") from None
        except OSError as e:
            raise InputError(source, key, f"file {ref!r} cannot be opened ({e.strerror or e})") from None
        if not stat.S_ISREG(info.st_mode):
            raise InputError(source, key, f"{ref!r} is not a regular file (a folder, FIFO or device); "
                             "allowed: a file")
        return path
    root = catalog_dir(kind)
    for candidate in (root / f"{ref}.toml", root / "hf" / f"{ref}.json"):
        if candidate.is_file():
            return candidate
    raise InputError(source, key, f"unknown {kind} catalog name {ref!r}; allowed: "
                                  f"{', '.join(catalog_names(kind))}, or a path to a file")
