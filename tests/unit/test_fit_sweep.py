"""Coordinate sweeps after the trust-region fit (sim.studies.fit_sweep, `zerosim fit --sweeps`):
they find the grid point a kinked loss hides from a gradient, never raise the loss, stop
when a round gains nothing, grid decade-wide ranges by ratio on the log scale, and are
saved to and taken from a checkpoint under their own name."""

from __future__ import annotations

import json

import pytest

from sim.cli import main
from sim.studies import fit_report as report
from sim.studies.fit import fit, swept
from sim.studies.fit_params import Param
from sim.studies.fit_sweep import GRID, coordinate_sweeps
from tests.unit.test_fit import TRUTH, rows_made_with

A = Param("A100", "matmul_efficiency", 0.55, 0.95, "test")
HOOK = Param("host", "host.zero3_hook_us", 20.0, 2000.0, "test")


def counted(f):
    calls: list[list[float]] = []

    def losses(points):
        calls.extend(points)
        return [f(x) for x in points]
    return losses, calls


def test_a_sweep_finds_the_lower_grid_point_past_a_kink_and_never_raises_the_loss():
    """Flat around the start (no slope for a gradient), lower at the top of the first range."""
    def kinked(x):
        return (1.0 if x[0] < 0.9 else 0.2) + abs(x[1] - 200.0) / 2000.0
    losses, calls = counted(kinked)
    x, rounds, best = coordinate_sweeps(losses, [0.7, 1000.0], [A, HOOK], [0, 1], rounds=5)
    assert x[0] == pytest.approx(0.95) and best == pytest.approx(kinked(x)) and best < kinked([0.7, 1000.0])
    assert x[1] == pytest.approx(20.0)        # linear grid 20, 515, ..., 2000: 20 is the point nearest 200
    assert all(kinked(p) >= best for p in calls)
    assert rounds == 2          # the second round gains nothing and ends the sweeps


def test_on_the_log_scale_a_decade_wide_range_is_gridded_by_ratio():
    losses, calls = counted(lambda x: abs(x[1] - 200.0))
    x, _, _ = coordinate_sweeps(losses, [0.7, 1000.0], [A, HOOK], [1], rounds=1, scale="log")
    assert x[1] == pytest.approx(200.0)                               # 20 x 100^0.5
    tried = sorted(p[1] for p in calls[1:])
    assert tried == pytest.approx(sorted(20.0 * 100.0 ** u for u in GRID if 20.0 * 100.0 ** u != 1000.0))
    assert all(p[0] == 0.7 for p in calls)                            # a parameter not free is never moved


def test_zero_rounds_leave_the_values_alone():
    losses, calls = counted(lambda x: x[0])
    assert coordinate_sweeps(losses, [0.7, 1000.0], [A, HOOK], [0, 1], rounds=0) == ([0.7, 1000.0], 0, 0.7)


def test_fit_with_sweeps_ends_no_higher_saves_them_and_says_so(tmp_path):
    rows = rows_made_with(TRUTH)
    keys = ("matmul_efficiency", "host.zero3_hook_us")
    path = tmp_path / "fit.json"
    plain = fit(rows, folds=0, jobs=1, only=keys, iterations=1, checkpoint=path)
    done = fit(rows, folds=0, jobs=1, only=keys, iterations=1, checkpoint=path, sweeps=2)
    assert set(json.loads(path.read_text())["fits"]) == {"in-sample", swept("in-sample")}
    (a,), (b,) = plain.outcomes, done.outcomes
    assert b.sweeps >= 1 and b.cost <= a.cost and b.iterations == a.iterations
    again = fit(rows, folds=0, jobs=1, only=keys, iterations=1, checkpoint=path, sweeps=2)
    assert again.values == done.values and again.outcomes == done.outcomes
    text = report.markdown(report.table(rows, done), done, ["made.csv"])
    assert "rounds of coordinate sweeps" in text and " sweeps, loss" in text


def test_the_command_refuses_a_negative_sweep_count(capsys):
    assert main(["fit", "x.csv", "--sweeps", "-1"]) == 2
    assert "--sweeps" in capsys.readouterr().err


def test_a_parameter_the_loss_hardly_sees_stays_where_the_fit_left_it():
    """A gain below SWEEP_MOVE_GAIN (0.1%) of the loss does not move a parameter to a grid point
    (a flat direction would otherwise choose a bound); a larger one does."""
    def nearly_flat(x):
        return 1.0 - 1e-4 * x[1] / 2000.0 + (0.0 if x[0] >= 0.95 else 0.01)
    losses, _ = counted(nearly_flat)
    x, _, best = coordinate_sweeps(losses, [0.7, 300.0], [A, HOOK], [0, 1], rounds=3)
    assert x[1] == 300.0                       # 2,000 us would gain 0.0085%: kept at 300
    assert x[0] == pytest.approx(0.95)         # a 1% gain: taken
    assert best == pytest.approx(nearly_flat([0.95, 300.0]))
