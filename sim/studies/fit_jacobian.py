"""The fit's Jacobian, by grouped forward differences, returned dense.

Each residual of `zerosim fit` (a row's log error, a GEMM table's excess) depends on a few
parameters only: a row on its GPU chip's, its cluster's and the host's. Columns whose
residuals do not overlap can be perturbed together and read apart (Curtis, Powell and
Reid 1974, "On the estimation of sparse Jacobian matrices"), so a group costs the
simulations of the rows it moves, as scipy's `jac_sparsity` does (scipy groups in a seeded
random column order, this module greedily in column order: the groups can differ, the
matrix not). Three differences from handing scipy the pattern:

- the step is a fixed share of each scaled parameter's range, where scipy takes a given
  relative step times the value, which near a floor is almost no step at all;
- every group's perturbed point is simulated in one batch (`Evaluator.warm`), so the
  worker pool stays full instead of waiting on the slowest row of each small group;
- the matrix goes back dense, so scipy's trust-region reflective solver takes its exact
  (SVD) step on a problem of a few dozen parameters, where a sparse Jacobian holds it to
  LSMR and a step in a two-dimensional subspace (scipy.optimize.least_squares,
  `tr_solver`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def column_groups(pattern: np.ndarray) -> list[list[int]]:
    """Columns of a 0/1 dependency pattern (residuals x parameters) in groups whose
    residuals do not overlap, greedily in column order (deterministic)."""
    groups: list[list[int]] = []
    covered: list[np.ndarray] = []
    for j in range(pattern.shape[1]):
        rows = pattern[:, j] != 0
        for group, seen in zip(groups, covered, strict=True):
            if not np.any(seen & rows):
                group.append(j)
                seen |= rows
                break
        else:
            groups.append([j])
            covered.append(rows.copy())
    return groups


def forward_differences(residuals_at: Callable[[Sequence[np.ndarray]], list[np.ndarray]],
                        u: np.ndarray, pattern: np.ndarray, step: float) -> np.ndarray:
    """d residuals / d u at `u` (each u in [0, 1]), one forward difference of `step` per
    group of columns, taken backwards where a forward step would leave [0, 1].
    `residuals_at(points)` gives the residuals at each point, simulating them together."""
    groups = column_groups(pattern)
    steps = np.where(u + step <= 1.0, step, -step)
    points = [u]
    for group in groups:
        moved = u.copy()
        moved[group] += steps[group]
        points.append(moved)
    base, *perturbed = residuals_at(points)
    jac = np.zeros((len(base), len(u)))
    for group, values in zip(groups, perturbed, strict=True):
        for j in group:
            rows = pattern[:, j] != 0
            jac[rows, j] = (values[rows] - base[rows]) / steps[j]
    return jac
