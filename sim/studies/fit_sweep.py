"""Coordinate sweeps after the trust-region fit (`zerosim fit --sweeps N`).

The fit's objective is a sum of robust log errors of simulated steps, each the longest of
its paths, so it has kinks where the path that decides a step changes, and a forward-
differenced trust-region fit stops at the first kink or shallow valley it meets (2026-12-07:
every fold of the shipped cross-validation ended 11-27% above the loss the catalog's values
give its own training rows, docs/fidelity.md "Where the folds stop"). A coordinate sweep
needs no gradient: for one parameter at a time it tries each point of a fixed grid over the
parameter's range (on the same linear or log scale the solver used), the others held, and
keeps the point with the lowest loss on the fit's own rows, but only where it lowers the
loss by at least `SWEEP_MOVE_GAIN` of it: a parameter the rows hardly see stays where the
fit left it. Until 2026-12-08 any gain moved it: a sweep of every row from the catalog took
the Grand Teton fabric's halving distance from 1,927 to its 2,000-node ceiling and the
500 W H100's `comm_interference` from 0.39 to its 0.4 ceiling for gains below 0.1% of the
loss (a bound won by a hair); with the rule, the same sweep moves FSDP2's hook cost alone,
300 us to its 2,000 us ceiling, for 0.36% (0.19481 to 0.19410). A round visits
every free parameter in the fit's fixed order, and the sweeps stop after `rounds` rounds or
a round that lowers the loss by less than `SWEEP_FTOL` of it. The loss never rises, no row
outside the fit's own scores a point, and the result is deterministic. Coordinate (compass) search:
Kolda, Lewis & Torczon, "Optimization by direct search", SIAM Review 45 (2003), Sec. 1.1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sim.studies.fit_params import Param, from_unit, spans_decades

GRID = (0.0, 0.25, 0.5, 0.75, 1.0)   # points of each range tried, as fractions on the solver's scale
SWEEP_FTOL = 1e-3                    # a round that lowers the loss by less than this share ends the sweeps
SWEEP_MOVE_GAIN = 1e-3               # a move is kept only where it lowers the loss by at least this share


def coordinate_sweeps(losses: Callable[[Sequence[list[float]]], list[float]], x0: Sequence[float],
                      params: Sequence[Param], free: Sequence[int], rounds: int,
                      scale: str = "linear") -> tuple[list[float], int, float]:
    """(values, rounds run, loss) after up to `rounds` rounds from `x0`. `losses` gives the
    loss at each of a batch of points (one batch per parameter: the grid's points are
    simulated together); `free` are the indices of the parameters the fit's rows depend on;
    `scale` as in sim.studies.fit.fit_rows (log: ranges of a decade or more by log ratio)."""
    x = list(x0)
    best = losses([x])[0]
    done = 0
    while done < rounds:
        before = best
        for j in free:
            p = params[j]
            points = [with_value(x, j, float(from_unit(p, u, scale == "log" and spans_decades(p)))) for u in GRID]
            points = [y for y in points if y != x]
            lowest, point = min(zip(losses(points), points, strict=True), key=lambda vp: vp[0],
                                default=(best, x))
            if lowest <= best * (1.0 - SWEEP_MOVE_GAIN):
                x, best = point, lowest
        done += 1
        if before - best < SWEEP_FTOL * before:
            break
    return x, done, best


def with_value(x: Sequence[float], j: int, v: float) -> list[float]:
    y = list(x)
    y[j] = v
    return y
