"""The fit's grouped forward-difference Jacobian (sim.studies.fit_jacobian): groups never
share a residual, the matrix equals the one column-by-column differences give, steps stay
inside [0, 1], and all perturbed points go to the simulator in one batch."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from sim.studies.fit_jacobian import column_groups, forward_differences

# residuals x parameters: rows 0-1 see a GPU's two keys, rows 2-3 another GPU's, all see the host key
PATTERN = np.array([[1, 1, 0, 0, 1],
                    [1, 0, 0, 0, 1],
                    [0, 0, 1, 1, 1],
                    [0, 0, 0, 1, 1]])


def model(u: np.ndarray) -> np.ndarray:
    """Residuals with the dependencies of PATTERN, nonlinear in each parameter."""
    return np.array([u[0] ** 2 + 3 * u[1] + np.exp(u[4]),
                     np.sin(u[0]) - u[4],
                     u[2] * u[3] + u[4] ** 3,
                     np.log1p(u[3]) + 2 * u[4]])


def test_columns_in_one_group_share_no_residual():
    groups = column_groups(PATTERN)
    assert sorted(j for g in groups for j in g) == list(range(PATTERN.shape[1]))
    for g in groups:
        rows = PATTERN[:, g].sum(axis=1)
        assert rows.max() <= 1, g
    assert len(groups) < PATTERN.shape[1]          # the two GPUs' keys are differenced together


def test_grouped_differences_equal_column_by_column_ones():
    u = np.array([0.3, 0.5, 0.2, 0.7, 0.4])
    step = 1e-6
    batches: list[int] = []

    def residuals_at(points: Sequence[np.ndarray]) -> list[np.ndarray]:
        batches.append(len(points))
        return [model(p) for p in points]

    jac = forward_differences(residuals_at, u, PATTERN, step)
    expected = np.zeros_like(jac)
    for j in range(len(u)):
        moved = u.copy()
        moved[j] += step
        expected[:, j] = (model(moved) - model(u)) / step
    assert jac == pytest.approx(expected, abs=1e-6)
    assert np.all(jac[PATTERN == 0] == 0)
    assert batches == [1 + len(column_groups(PATTERN))]     # one batch: the point and each group's


def test_a_step_that_would_leave_the_range_is_taken_backwards():
    u = np.array([1.0, 0.5, 0.995, 0.0, 0.2])
    seen: list[np.ndarray] = []

    def residuals_at(points: Sequence[np.ndarray]) -> list[np.ndarray]:
        seen.extend(points)
        return [model(p) for p in points]

    jac = forward_differences(residuals_at, u, PATTERN, 0.01)
    assert all(np.all((p >= 0) & (p <= 1)) for p in seen)
    assert jac[0, 0] == pytest.approx(2 * 1.0 - 0.01, rel=1e-6)     # (1^2 - 0.99^2) / 0.01
