"""The one error type users see: bad input, named by file and key.

The CLI turns an `InputError` into a one-line message on stderr and exit status 2
(design.md, results contract). Everything else that goes wrong is a bug.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


class InputError(ValueError):
    """A scenario, model, hardware or DeepSpeed file (or a flag) that we cannot accept."""

    def __init__(self, source: str | Path, key: str, problem: str) -> None:
        self.source, self.key, self.problem = str(source), key, problem
        super().__init__(f"{self.source}: {key}: {problem}" if key else f"{self.source}: {problem}")


def allowed(values: Iterable[object]) -> str:
    """'allowed: a, b, c' for error messages."""
    return "allowed: " + ", ".join(str(v) for v in values)
