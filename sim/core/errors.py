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
        self.source, self.key, self.problem = one_line(str(source)), one_line(key), one_line(problem)
        text = f"{self.source}: {self.key}: {self.problem}" if key else f"{self.source}: {self.problem}"
        super().__init__(text)


def one_line(text: str) -> str:
    """Control characters (a newline inside a key of a hostile file) as visible escapes, so
    that a message stays one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def allowed(values: Iterable[object]) -> str:
    """'allowed: a, b, c' for error messages."""
    return "allowed: " + ", ".join(str(v) for v in values)
