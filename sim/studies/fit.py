"""`zerosim fit`: fit the physical clock parameters (sim.studies.fit_params) to published
step times, with k-fold cross-validation.

Objective: the residual of a row is log(predicted / measured) step time, the predicted one
from the DES (representative mode, one step) on the row's scenario with the parameters set.
scipy's bounded trust-region least squares (`least_squares`, method 'trf') minimises a
robust soft-L1 loss of the residuals (`F_SCALE`: errors beyond about 15% count linearly,
so a row that the scenario format cannot express well does not drag every parameter).
A chip with a measured GEMM table (sim.studies.gemm_table: H100) adds one residual that
stays 0 while the GPU file the parameters make matches that table within 10% median (over
every shape and over the large ones) and grows steeply beyond (GemmConstraint): step times
cannot move a chip's GEMMs off what it was measured to run.
The Jacobian is taken by forward differences with the sparsity each row implies (a row
depends only on its chip's, its cluster's and its engine's parameters), and every
prediction is cached by the values of the parameters it depends on, so one Jacobian costs
about as many simulations per row as the row has parameters.

Cross-validation (`folds` > 1): rows sorted by id are dealt into folds round-robin; each
fold is predicted by parameters fitted on the other folds only, started from the priors
(the values before any fit, from published sources) wherever the catalog keeps them: the
catalog's current values were fitted on these rows, held-out ones included, and a fold
started there stays near them (2026-12-06: every fold converged within 4.3% of the
catalog's values, near-zero A100 `comm_interference` aside, and the CV median |error|
equalled the in-sample one), which is not cross-validation. The in-sample fit may start
from the catalog (a warm start: its figures describe the values it ends at). The report
gives both: in-sample (fit on all rows) and cross-validated errors.
"""

from __future__ import annotations

import math
import multiprocessing as mp
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from sim.des.engine import EventEngine, Mode
from sim.engines.plan import check_work, layout_of, plan
from sim.engines.schedule import Schedule
from sim.inputs.catalog import catalog_dir
from sim.inputs.scenario import Scenario
from sim.studies.fit_checkpoint import Checkpoint, Outcome, SavedFit, fingerprint
from sim.studies.fit_jacobian import forward_differences
from sim.studies.fit_objective import F_SCALE, free_parameters, gemm_constraints, objective_residuals, sweep_rows
from sim.studies.fit_params import (
    Param,
    applied,
    from_unit,
    ideal_start,
    parameters,
    prior_values,
    spans_decades,
    start_values,
    to_unit,
)
from sim.studies.published import read_rows

DIFF_STEP = 0.02      # forward-difference step on the [0, 1]-scaled parameters (fit_rows: how each solver takes it)
CATALOG_HARDWARE = catalog_dir("hardware")   # its fitted keys' comments keep their priors
SOLVERS = ("subspace", "exact")   # fit_rows
SCALES = ("linear", "log")        # fit_rows: how a parameter's range maps onto the solver's [0, 1]
MAX_ITERATIONS = 8    # trust-region iterations (each takes one sparse Jacobian); 4 left a two-parameter synthetic fit 19% off


@dataclass(frozen=True)
class FitRow:
    """One published measurement with the scenario that expresses it."""

    id: str
    scenario: Scenario
    measured_s: float
    group: str = ""          # engine / source label for the report
    # other scenarios the row may describe (an unstated micro-batch: every one that fits,
    # sim.studies.published_micro); its prediction is the fastest of them and `scenario`
    alternatives: tuple[Scenario, ...] = ()

    @property
    def variants(self) -> tuple[Scenario, ...]:
        return (self.scenario,) + tuple(a for a in self.alternatives if a is not self.scenario)


@dataclass
class FitResult:
    params: list[Param]
    start: list[float]                             # where the in-sample fit started
    values: list[float]
    predicted: dict[str, float]                    # in-sample, by row id
    cross_validated: dict[str, float] = field(default_factory=dict)
    chosen: dict[str, Scenario] = field(default_factory=dict)   # in-sample: the fastest variant of a row with several
    fold_values: list[list[float]] = field(default_factory=list)
    simulations: int = 0
    outcomes: list[Outcome] = field(default_factory=list)   # in-sample first, then each fold's
    knee: float = F_SCALE                          # the soft-L1 loss's knee it was fitted with
    solver: str = "subspace"                       # how each trust-region step was solved (fit_rows)
    scale: str = "linear"                          # how each parameter's range met the solver (fit_rows)
    ideal: bool = False                            # each fit also ran from ideal_start and kept the lower loss
    sweeps: int = 0                                # each fit then ran up to this many coordinate sweeps
    fold_start: list[float] = field(default_factory=list)   # where each fold's fit started
    folds_from_priors: bool = False                # fold_start holds the priors the catalog keeps


def usable_rows(csvs: Sequence[str | Path]) -> list[FitRow]:
    """The rows of published-measurement CSVs a fit can use (a scenario and a measured step
    time, sim.studies.published), in file order."""
    return [FitRow(r.id, r.scenario, r.measured_step_s, r.source, r.alternatives)
            for csv in csvs for r in read_rows(str(csv)) if r.scenario is not None and r.measured_step_s]


_ROWS: list[FitRow] = []             # set before the worker pool forks
_PLANS: dict[int, list[Schedule | None]] = {}  # each row's schedules (one per variant): the fitted parameters never change them


def _simulate(job: tuple[int, tuple[Param, ...], tuple[float, ...]]) -> tuple[float, int]:
    """One row's step time under the parameter values and which variant gave it: the
    fastest of its variants (their planned schedules reused: the clock parameters change op
    durations, never the ops)."""
    i, params, values = job
    plans = _PLANS.get(i) or [None]
    if plans[0] is None:
        return math.nan, 0
    times = [(_step(applied(s, params, values), schedule), k)
             for k, (s, schedule) in enumerate(zip(_ROWS[i].variants, plans, strict=True)) if schedule is not None]
    return min(((t, k) for t, k in times if not math.isnan(t)), default=(math.nan, 0))


def _step(s: Scenario, schedule: Schedule) -> float:
    try:
        engine = EventEngine(s, schedule, layout_of(s), Mode.REPRESENTATIVE)
        engine.run(1)
    except Exception:          # a row that cannot be simulated is reported as nan, never a crash
        return math.nan
    start, end = engine.step_bounds[-1]
    return end - start


def _plan(s: Scenario) -> Schedule | None:
    try:
        check_work(s, steps=1, full=False)
        return plan(s)
    except Exception:
        return None


class Evaluator:
    """Step times of rows under parameter values, cached, computed `jobs` at a time."""

    def __init__(self, rows: Sequence[FitRow], params: Sequence[Param], jobs: int,
                 progress: Callable[[str], None] | None = None) -> None:
        self.rows, self.params, self.jobs = list(rows), list(params), jobs
        self.deps = [tuple(j for j, p in enumerate(params) if p.applies(r.scenario)) for r in rows]
        self.cache: dict[tuple[int, tuple[float, ...]], float] = {}
        self.variant: dict[tuple[int, tuple[float, ...]], int] = {}   # the fastest variant's index
        self.progress = progress
        self.simulations = 0
        self._pool: mp.pool.Pool | None = None
        self._ops: list[int] = []    # planned ops per row, all variants: what a simulation of it costs

    def __enter__(self) -> Evaluator:
        global _ROWS
        _ROWS = self.rows
        _PLANS.clear()
        _PLANS.update((i, [_plan(s) for s in r.variants]) for i, r in enumerate(self.rows))
        self._ops = [sum(len(ops) for p in _PLANS[i] if p is not None for c in p.classes for ops in c.streams.values())
                     for i in range(len(self.rows))]
        if self.jobs > 1:
            self._pool = mp.get_context("fork").Pool(self.jobs)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.terminate()

    def simulated(self, i: int) -> bool:
        """Whether row `i` has a planned schedule (a row that cannot be planned is not fitted)."""
        return _PLANS[i][0] is not None

    def _key(self, i: int, x: Sequence[float]) -> tuple[int, tuple[float, ...]]:
        return i, tuple(round(float(x[j]), 12) for j in self.deps[i])

    def chosen(self, i: int, x: Sequence[float]) -> Scenario:
        """The variant of row `i` that `predict` timed under `x` (after predicting it)."""
        return self.rows[i].variants[self.variant.get(self._key(i, x), 0)]

    def predict(self, idx: Sequence[int], x: Sequence[float]) -> np.ndarray:
        self.warm(idx, [x])
        return np.array([self.cache[self._key(i, x)] for i in idx])

    def warm(self, idx: Sequence[int], xs: Sequence[Sequence[float]]) -> None:
        """Simulate, in one batch over the worker pool, every row of `idx` under each of
        `xs` that is not cached yet (a Jacobian's perturbed points: no worker waits for the
        slowest row of one small group). The rows with the most planned ops go first, so
        that the pool's last simulations are short ones (longest processing time first,
        Graham 1969: no worker sits idle while another finishes a long row); each result
        is cached by its key, so the order changes nothing else."""
        todo = sorted({k for x in xs for k in (self._key(i, x) for i in idx) if k not in self.cache},
                      key=lambda k: (-self._ops[k[0]], k))
        jobs = [(i, tuple(self.params[j] for j in self.deps[i]), vals) for i, vals in todo]
        done = self._pool.map(_simulate, jobs, chunksize=1) if self._pool else [_simulate(j) for j in jobs]
        self.cache.update(zip(todo, (t for t, _ in done), strict=True))
        self.variant.update(zip(todo, (k for _, k in done), strict=True))
        self.simulations += len(jobs)
        if self.progress and jobs:
            self.progress(f"{len(jobs)} simulations ({self.simulations} in all)")


def fit_rows(ev: Evaluator, idx: Sequence[int], x0: Sequence[float], iterations: int = MAX_ITERATIONS,
             knee: float = F_SCALE, solver: str = "subspace", scale: str = "linear") -> tuple[list[float], Outcome]:
    """Bounded robust least squares on the rows `idx`, from `x0` (soft-L1 with its knee at
    `knee` of log error), with each measured GEMM table's constraint (GemmConstraint) as a
    residual; parameters that none of these rows depends on stay at `x0`. Returns the values
    and how the fit ended (scipy status 0: the evaluation cap, `iterations` + 1).

    `solver` (SOLVERS): "subspace" hands scipy the Jacobian's sparsity, so it differences
    the columns itself and solves each trust-region step by LSMR in a two-dimensional
    subspace (every shipped fit so far). scipy takes a given `diff_step` relative to the
    value (scipy.optimize._numdiff._compute_absolute_step: DIFF_STEP x |u|, no max(1, |u|)),
    so its difference is 0.02 x u of a parameter's range: 1% of the range at mid-range,
    almost nothing at a floor. "exact" differences groups of the same kind in one batch
    with a step of DIFF_STEP of the range whatever u (backwards at the ceiling) and hands
    scipy a dense Jacobian, whose step it solves exactly by SVD (sim.studies.fit_jacobian).
    From the priors on the 76 rows at 16 iterations, 2026-12-07: "exact" converged after 12
    evaluations at a loss of 0.235, "subspace" stopped at the cap (17) at 0.298, in about
    the same 25 minutes; but on fold 1 of a cross-validation (61 rows) "exact" stopped at
    the cap at 0.227 where "subspace" reached 0.190. The two differ in the difference step
    as well as in the step solver, and which of the two made either difference was not
    measured.

    `scale` (SCALES): the solver works on each parameter mapped onto [0, 1] between its
    bounds, "linear"ly (every shipped fit so far) or, with "log", by log(x / low) /
    log(high / low) for a range of a decade or more (`spans_decades`: launch and hook costs,
    a fabric's halving distance, CPU-Adam and fresh-page copy rates, kernel gaps, ZeRO-3's
    per-slice cost). A row's residual is a log step time and these costs and rates move it
    by ratios: on a linear scale a hook cost of 20-2,000 us puts 20 and 200 us a tenth of
    the range apart and a trust region sized for one end is far too small or far too large
    at the other; on a log scale each decade is the same distance."""
    free = free_parameters(ev, idx)
    if not free:
        return list(x0), Outcome(True, 0, 0.0)
    params = [ev.params[j] for j in free]
    logs = [scale == "log" and spans_decades(p) for p in params]

    def full(u: np.ndarray) -> list[float]:      # u: free parameters scaled to [0, 1]
        x = list(x0)
        for n, j in enumerate(free):
            x[j] = float(from_unit(params[n], float(u[n]), logs[n]))
        return x

    constraints = gemm_constraints(ev, idx)
    pattern = np.array([[1 if j in deps else 0 for j in free]
                        for deps in [ev.deps[i] for i in idx] + [c.deps for c in constraints]])

    def all_residuals(x: list[float]) -> np.ndarray:
        return objective_residuals(ev, idx, constraints, x)

    def residuals_at(points: Sequence[np.ndarray]) -> list[np.ndarray]:
        ev.warm(idx, [full(u) for u in points])
        return [all_residuals(full(u)) for u in points]

    u0 = np.clip([to_unit(p, x0[j], log) for p, j, log in zip(params, free, logs, strict=True)], 0.0, 1.0)
    # u lies in [0, 1]: "exact" differences by DIFF_STEP of the range, scipy by DIFF_STEP x u (docstring)
    def dense_jacobian(u: np.ndarray) -> np.ndarray:
        return forward_differences(residuals_at, u, pattern, DIFF_STEP)

    # "subspace" with one free parameter: dense (scipy's sparse solver fails at n = 1)
    jac: Callable[[np.ndarray], np.ndarray] | str = dense_jacobian if solver == "exact" else "2-point"
    sparsity = pattern if solver != "exact" and len(free) > 1 else None
    out = least_squares(lambda u: all_residuals(full(u)), u0, bounds=(0.0, 1.0), method="trf",
                        loss="soft_l1", f_scale=knee, jac=jac, jac_sparsity=sparsity, diff_step=DIFF_STEP,
                        x_scale="jac", max_nfev=iterations + 1, xtol=1e-3, ftol=1e-4)
    return full(out.x), Outcome(bool(out.status > 0), int(out.nfev), float(out.cost))


def from_ideal(name: str) -> str:
    """The checkpoint name of fit `name` run from the ideal start (`fit(ideal=True)`)."""
    return f"{name} from the ideal start"


def swept(name: str) -> str:
    """The checkpoint name of fit `name` after its coordinate sweeps (`fit(sweeps=N)`)."""
    return f"{name}, swept"


def folds_of(rows: Sequence[FitRow], k: int) -> list[list[int]]:
    """Row indices dealt into k folds round-robin in id order (deterministic)."""
    order = sorted(range(len(rows)), key=lambda i: rows[i].id)
    return [order[f::k] for f in range(k)]


def fit(rows: Sequence[FitRow], *, folds: int = 5, jobs: int = 2, only: Sequence[str] = (),
        iterations: int = MAX_ITERATIONS, progress: Callable[[str], None] | None = None,
        priors: Path | None = CATALOG_HARDWARE, from_priors: bool = False,
        knee: float = F_SCALE, checkpoint: Path | None = None, solver: str = "subspace",
        scale: str = "linear", ideal: bool = False, sweeps: int = 0) -> FitResult:
    """Fit on all rows (in-sample) and, with `folds` > 1, on each k-1 folds (cross-validated),
    each with the soft-L1 loss's knee at `knee`.
    `priors` is a hardware folder whose fitted keys' comments keep their priors
    (sim.studies.fit_params.prior_values; by default the catalog's): the folds start from
    those priors (the catalog's value where a key has none), the in-sample fit from the
    catalog's values, or from the priors too with `from_priors`. `priors=None` starts every
    fit from the catalog: its folds then start from values fitted on their held-out rows.
    `checkpoint`: a file each finished fit is saved to, and taken from when it holds the
    fits of this same code, rows and options (sim.studies.fit_checkpoint). `solver`: how
    each trust-region step is solved, `scale`: how each range maps onto the solver's
    (`fit_rows`). `ideal`: every fit (in-sample and each fold) is run a second time from
    `ideal_start` of its start and keeps whichever of the two ends at the lower loss on its
    own rows: the objective has more than one basin (docs/fidelity.md), and a second start
    that no row chose is still cross-validation, since held-out rows never score a start.
    `sweeps`: then up to that many rounds of coordinate sweeps from the kept fit, on its own
    rows (`sweep_rows`; saved under `swept(name)`)."""
    params = parameters([r.scenario for r in rows], only)
    catalog_x = start_values(params, [r.scenario for r in rows])
    prior_x = catalog_x if priors is None else [
        x if v is None else min(p.high, max(p.low, v))
        for p, x, v in zip(params, catalog_x, prior_values(params, priors), strict=True)]
    x0 = prior_x if from_priors else catalog_x
    if solver not in SOLVERS or scale not in SCALES:
        raise ValueError(f"solver {solver!r}, scale {scale!r}: allowed {SOLVERS} and {SCALES}")
    # `ideal` and `sweeps` are not in the fingerprint: the ideal start's fits and the swept
    # ones are saved under names of their own, and the others are the same fits without them
    store = None if checkpoint is None else Checkpoint.open(
        checkpoint, fingerprint((rows, params, x0, prior_x, folds, iterations, knee, solver, scale)))
    with Evaluator(rows, params, jobs, progress) as ev:
        everything = [i for i in range(len(rows)) if ev.simulated(i)]   # the rest: not simulated
        if progress:
            progress(f"fitting {len(params)} parameters to {len(rows)} rows")
        saved = 0

        def fitted(name: str, idx: list[int], start: list[float]) -> tuple[list[float], Outcome]:
            """The fit from `start` or, with `ideal`, the lower-loss one of it and the fit from
            `ideal_start(start)` (not run when that is `start` itself); then, with `sweeps`,
            its coordinate sweeps."""
            values, outcome = fitted_from(name, idx, start)
            second = ideal_start(params, start)
            if ideal and second != start:
                other, how = fitted_from(from_ideal(name), idx, second)
                if how.cost < outcome.cost:
                    name, values, outcome = from_ideal(name), other, replace(how, start="ideal")
            return swept_from(name, idx, values, outcome) if sweeps else (values, outcome)

        def swept_from(name: str, idx: list[int], values: list[float], outcome: Outcome) -> tuple[list[float], Outcome]:
            """Fit `name` after its sweeps, from the checkpoint or swept now from `values`."""
            def sweep() -> tuple[list[float], Outcome]:
                x, rounds, cost = sweep_rows(ev, idx, values, sweeps, knee, scale)
                return x, replace(outcome, cost=cost, sweeps=rounds)
            return stored(swept(name), sweep)

        def fitted_from(name: str, idx: list[int], start: list[float]) -> tuple[list[float], Outcome]:
            """The fit `name` from the checkpoint, or fitted now from `start`."""
            return stored(name, lambda: fit_rows(ev, idx, start, iterations, knee, solver, scale))

        def stored(name: str, run: Callable[[], tuple[list[float], Outcome]]) -> tuple[list[float], Outcome]:
            """Fit `name` from the checkpoint, or `run()` now and saved there."""
            nonlocal saved
            done = store.get(name) if store else None
            if done is not None:
                saved += done.simulations
                if progress:
                    progress(f"{name}: taken from {checkpoint}")
                return done.values, done.outcome
            before = ev.simulations
            values, outcome = run()
            if store:
                store.save(name, SavedFit(values, outcome, ev.simulations - before))
            return values, outcome

        values, outcome = fitted("in-sample", everything, x0)
        predicted = dict(zip((rows[i].id for i in everything), ev.predict(everything, values).tolist(), strict=True))
        result = FitResult(params, x0, values, predicted, fold_start=prior_x, folds_from_priors=priors is not None,
                           chosen={rows[i].id: ev.chosen(i, values) for i in everything if rows[i].alternatives},
                           outcomes=[outcome], knee=knee, solver=solver, scale=scale, ideal=ideal, sweeps=sweeps)
        if folds > 1:
            for f, fold in enumerate(folds_of(rows, folds)):
                test = [i for i in fold if i in everything]
                if progress:
                    progress(f"fold {f + 1} of {folds}: {len(test)} rows held out")
                train = [i for i in everything if i not in test]
                fold_x, outcome = fitted(f"fold {f + 1}", train, prior_x)
                result.fold_values.append(fold_x)
                result.outcomes.append(outcome)
                for i, t in zip(test, ev.predict(test, fold_x).tolist(), strict=True):
                    result.cross_validated[rows[i].id] = t
        result.simulations = ev.simulations + saved   # a resumed fit counts the saved fits' too
    return result
