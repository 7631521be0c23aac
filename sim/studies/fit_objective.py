"""The objective `zerosim fit` minimises (sim.studies.fit): each row's log step-time error
and, for a chip with a measured GEMM table (sim.studies.gemm_table: H100), one residual that
stays 0 while the GPU file the parameters make matches that table within the bound and grows
steeply beyond (`GemmConstraint`), under scipy's soft-L1 loss (`loss`); and the coordinate
sweeps on that loss (`sweep_rows`, sim.studies.fit_sweep)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from sim.studies.fit_params import Param, applied, chip
from sim.studies.fit_sweep import coordinate_sweeps
from sim.studies.gemm_table import GEMM_BOUND, TABLES, excess, measured


class Evaluator(Protocol):
    """What the objective needs of sim.studies.fit.Evaluator: the rows, the parameters, each
    row's dependencies, and cached step times."""

    rows: list[Any]                 # sim.studies.fit.FitRow
    params: list[Param]
    deps: list[tuple[int, ...]]

    def predict(self, idx: Sequence[int], x: Sequence[float]) -> np.ndarray: ...

    def warm(self, idx: Sequence[int], xs: Sequence[Sequence[float]]) -> None: ...

F_SCALE = 0.15        # soft-L1 knee on log error (about 15%)
GEMM_WEIGHT = 50.0    # residual per unit of GEMM-table median |error| beyond the bound: one point costs
                      # as much as a row 65% off, so the table acts as a near-hard limit
GEMM_MARGIN = 0.005   # the penalty starts this far inside GEMM_BOUND: a penalty's optimum lies a little past
                      # where it starts (2026-12-06: the catalog-start fit ended with H100's large shapes at
                      # 10.05%), and the fitted file must keep the bound the tests hold it to


def residuals(ev: Evaluator, idx: Sequence[int], x: Sequence[float]) -> np.ndarray:
    """log(predicted / measured) per row; a row that failed counts as a large miss (log 2)."""
    pred = ev.predict(idx, x)
    meas = np.array([ev.rows[i].measured_s for i in idx])
    r = np.log(pred / meas)
    return np.where(np.isfinite(r), r, math.log(2.0))


class GemmConstraint:
    """A chip's measured GEMM table (sim.studies.gemm_table) as one extra residual of a fit:
    0 while the GPU file the parameters make keeps the table within `GEMM_BOUND` -
    `GEMM_MARGIN` median |error| (every shape, and the large ones), then `GEMM_WEIGHT` per
    unit beyond, so the fit cannot buy step-time accuracy with GEMMs slower (or faster)
    than the chip runs them. It depends on the chip's `matmul_efficiency` and
    `memory_bandwidth_efficiency` (a GEMM's operand traffic runs at the latter)."""

    KEYS = ("matmul_efficiency", "memory_bandwidth_efficiency")

    def __init__(self, ev: Evaluator, row: int, chip_name: str) -> None:
        table = measured(chip_name)
        assert table is not None, chip_name
        self.ev, self.row, self.table = ev, row, table
        self.deps = [j for j in ev.deps[row] if ev.params[j].scope == chip_name and ev.params[j].key in self.KEYS]
        self.cache: dict[tuple[float, ...], float] = {}

    def excess(self, x: Sequence[float]) -> float:
        """How far the table's medians |error| lie beyond the bound under `x` (0 within)."""
        key = tuple(round(float(x[j]), 12) for j in self.deps)
        if key not in self.cache:
            gpu = applied(self.ev.rows[self.row].scenario, self.ev.params, x).cluster.node.gpu
            self.cache[key] = excess(gpu, self.table, GEMM_BOUND - GEMM_MARGIN)
        return self.cache[key]


def gemm_constraints(ev: Evaluator, idx: Sequence[int]) -> list[GemmConstraint]:
    """One constraint per chip with a measured GEMM table that some row of `idx` runs on."""
    out = []
    for name in TABLES:
        on_chip = [i for i in idx if chip(ev.rows[i].scenario.cluster.node.gpu) == name]
        if on_chip:
            out.append(GemmConstraint(ev, on_chip[0], name))
    return [c for c in out if c.deps]


def objective_residuals(ev: Evaluator, idx: Sequence[int], constraints: Sequence[GemmConstraint],
                        x: Sequence[float]) -> np.ndarray:
    """What the fit minimises: each row's log error, then each GEMM table's weighted excess."""
    extra = [GEMM_WEIGHT * c.excess(x) for c in constraints]
    return np.concatenate([residuals(ev, idx, x), np.array(extra)])


def loss(ev: Evaluator, idx: Sequence[int], x: Sequence[float], knee: float = F_SCALE) -> float:
    """The fit's objective on the simulated rows `idx` (`Evaluator.simulated`) at `x`, as scipy reports it (`least_squares`'s
    `cost`: 0.5 knee^2 sum rho((r / knee)^2), soft-L1 rho(z) = 2 (sqrt(1 + z) - 1))."""
    return soft_l1_cost(objective_residuals(ev, idx, gemm_constraints(ev, idx), x), knee)


def soft_l1_cost(r: np.ndarray, knee: float) -> float:
    return float(0.5 * knee ** 2 * np.sum(2.0 * (np.sqrt(1.0 + (r / knee) ** 2) - 1.0)))


def free_parameters(ev: Evaluator, idx: Sequence[int]) -> list[int]:
    """The parameters some row of `idx` depends on (the others stay where they start)."""
    return [j for j in range(len(ev.params)) if any(j in ev.deps[i] for i in idx)]


def sweep_rows(ev: Evaluator, idx: Sequence[int], x0: Sequence[float], rounds: int, knee: float = F_SCALE,
               scale: str = "linear") -> tuple[list[float], int, float]:
    """Up to `rounds` coordinate sweeps (sim.studies.fit_sweep) over the parameters the rows
    `idx` depend on, from `x0`, on the fit's objective (`loss`): (values, rounds run, loss)."""
    constraints = gemm_constraints(ev, idx)

    def losses(points: Sequence[list[float]]) -> list[float]:
        ev.warm(idx, points)
        return [soft_l1_cost(objective_residuals(ev, idx, constraints, y), knee) for y in points]
    return coordinate_sweeps(losses, x0, ev.params, free_parameters(ev, idx), rounds, scale)
