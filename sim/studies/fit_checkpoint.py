"""A fit's finished parts, kept so that a long cross-validation can stop and resume
(`zerosim fit --checkpoint FILE`).

A cross-validated fit is 1 + k least-squares fits (in-sample, then each fold), each from
minutes to half an hour of simulations on 2 cores at the default iterations and twice that
when converged (`--iterations 16`). After each one ends, its fitted values, how it ended
(`Outcome`) and the simulations it took go into FILE (JSON, written whole to
a temporary file and then renamed over FILE, so a run killed mid-write leaves the previous
FILE). A later run given the same FILE takes the fits it holds instead of fitting them
again, and fits the rest. The fits are deterministic, so the result is the one an
uninterrupted run gives.

Only a checkpoint of the same work is taken: FILE holds a fingerprint (SHA-256) of the
simulator's code (every .py file of the `sim` package), the rows (ids, measured step
times, scenarios with their hardware values) and the fit's options (parameters with their
bounds, start values, folds, iterations, loss knee, solver, scale; not `--ideal-start` or
`--sweeps`, whose fits are saved under names of their own). Another fingerprint is refused, since
a cross-validation resumed on other code or rows would mix two models in one report.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sim.core.errors import InputError

PACKAGE = Path(__file__).resolve().parent.parent      # the `sim` package
FORMAT = "zerosim fit checkpoint 2"


def fingerprint(parts: Iterable[object]) -> str:
    """SHA-256 of the simulator's code and the repr of each part (rows, options)."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        digest.update(str(path.relative_to(PACKAGE)).encode())
        digest.update(path.read_bytes())
    for part in parts:
        digest.update(repr(part).encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class Outcome:
    """How one least-squares fit ended (scipy's `least_squares` result): `converged` when it
    stopped on its tolerances (ftol / xtol / gtol), not on the iteration cap; `cost` is
    the robust loss it reached (0.5 x sum of soft-L1 terms, the GEMM constraints included);
    `start` names where the kept fit started when it was not the fit's own start (`zerosim
    fit --ideal-start`: "ideal")."""

    converged: bool
    iterations: int
    cost: float
    start: str = ""
    sweeps: int = 0        # coordinate sweeps run after the trust-region fit (`cost` is after them)

    def describe(self) -> str:
        how = "converged" if self.converged else "stopped at the iteration cap"
        where = f" from the {self.start} start" if self.start else ""
        then = f", then {self.sweeps} coordinate sweep{'s' if self.sweeps > 1 else ''}" if self.sweeps else ""
        return f"{how} after {self.iterations} evaluations{where}{then}, loss {self.cost:.4g}"


@dataclass
class SavedFit:
    """One finished fit: its values, how it ended and the simulations it took."""

    values: list[float]
    outcome: Outcome
    simulations: int

    @staticmethod
    def from_json(data: dict[str, Any]) -> SavedFit:
        return SavedFit(list(data["values"]), Outcome(**data["outcome"]), int(data["simulations"]))

    def to_json(self) -> dict[str, Any]:
        return {"values": self.values, "outcome": asdict(self.outcome), "simulations": self.simulations}


@dataclass
class Checkpoint:
    """The fits FILE holds, by name ('in-sample', 'fold 1', ...), for one fingerprint."""

    path: Path
    key: str
    fits: dict[str, SavedFit] = field(default_factory=dict)

    @staticmethod
    def open(path: Path, key: str) -> Checkpoint:
        """FILE's fits when it was written for `key`; none when FILE does not exist yet."""
        if not path.exists():
            return Checkpoint(path, key)
        try:
            data = json.loads(path.read_text())
            if data.get("format") != FORMAT:
                raise ValueError(f"its format is {data.get('format')!r}, not {FORMAT!r}")
            fits = {name: SavedFit.from_json(fit) for name, fit in data["fits"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise InputError(path, "checkpoint", f"not a checkpoint zerosim fit wrote ({error}); allowed: "
                                                 "a file an earlier `zerosim fit --checkpoint` wrote, or a new path")
        if data.get("fingerprint") != key:
            raise InputError(path, "fingerprint", "written by a fit of other code, rows or options, so its fits "
                                                  "cannot be reused; allowed: the checkpoint of this same fit "
                                                  "(same code, CSVs, --params, --only, --folds, --iterations, --solver, --scale, "
                                                  "--loss-knee, --from-priors), or a new path")
        return Checkpoint(path, key, fits)

    def get(self, name: str) -> SavedFit | None:
        return self.fits.get(name)

    def save(self, name: str, fit: SavedFit) -> None:
        """Add one finished fit and rewrite FILE whole (temporary file, then rename)."""
        self.fits[name] = fit
        data: dict[str, Any] = {"format": FORMAT, "fingerprint": self.key,
                                "fits": {n: f.to_json() for n, f in self.fits.items()}}
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(data, indent=1) + "\n")
            os.replace(tmp, self.path)
        except OSError as error:
            raise InputError(self.path, "checkpoint", f"cannot be written ({error.strerror or error}); "
                                                      "allowed: a writable path") from None
