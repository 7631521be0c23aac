"""What `zerosim fit` reports: one row per published measurement (in-sample and
cross-validated prediction and error), the error statistics, the fitted parameters, a
predicted-vs-published scatter plot and the markdown block docs/fidelity.md holds.

Error of a row: (predicted - published) / published step time; |error| statistics are
medians and maxima over the rows that were simulated.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from sim.inputs.scenario import Scenario
from sim.studies.fit import FitResult, FitRow
from sim.studies.fit_sweep import SWEEP_MOVE_GAIN

BEGIN, END = "<!-- zerosim fit: begin -->", "<!-- zerosim fit: end -->"


def engine_label(s: Scenario) -> str:
    """'ddp', 'fsdp2', 'deepspeed z3', 'deepspeed z3+offload', ..."""
    if s.zero is not None:
        off = "+offload" if s.zero.offload_optimizer.enabled or s.zero.offload_param.enabled else ""
        return f"deepspeed z{int(s.zero.stage)}{off}"
    return str(s.engine)


def shards_parameters(engine: str) -> bool:
    """Whether an `engine_label` shards the parameters (ZeRO-3, with or without offload; FSDP2)."""
    return engine.startswith("deepspeed z3") or engine == "fsdp2"


def table(rows: Sequence[FitRow], result: FitResult) -> pd.DataFrame:
    """One row per measurement: its layout, the published step, in-sample and
    cross-validated predictions and errors (NaN where not simulated)."""
    out = []
    for r in rows:
        s = result.chosen.get(r.id, r.scenario)      # an unstated micro-batch: the fitted clock's fastest
        p = s.parallel
        fit_s = result.predicted.get(r.id, math.nan)
        cv_s = result.cross_validated.get(r.id, math.nan)
        out.append({"id": r.id, "source": r.group, "model": s.model.name, "gpus": s.world_size,
                    "gpu": s.cluster.node.gpu.name, "layout": f"{p.tp}/{p.pp}/{p.dp}", "engine": engine_label(s),
                    "micro_global": f"{s.training.micro_batch}/{s.training.global_batch}",
                    "published_s": r.measured_s, "fitted_s": fit_s, "fitted_error": fit_s / r.measured_s - 1,
                    "cv_s": cv_s, "cv_error": cv_s / r.measured_s - 1})
    return pd.DataFrame(out)


def stats(errors: pd.Series) -> dict[str, float]:
    """median |error|, worst |error|, median signed error, row count (NaNs dropped)."""
    e = errors.dropna()
    if e.empty:
        return {"rows": 0, "median_abs": math.nan, "worst_abs": math.nan, "median_signed": math.nan}
    return {"rows": int(e.size), "median_abs": float(e.abs().median()), "worst_abs": float(e.abs().max()),
            "median_signed": float(e.median())}


def summary(df: pd.DataFrame) -> dict[str, dict[str, dict[str, float]]]:
    """Statistics in-sample and cross-validated, overall, ZeRO-3 / FSDP2 (sharded
    parameters) against the rest, and per engine."""
    groups: dict[str, pd.Series] = {"all": pd.Series(True, index=df.index)}
    sharded = df["engine"].map(shards_parameters).astype(bool)
    groups["zero-3 / fsdp2"] = sharded
    groups["other"] = ~sharded
    for engine in sorted(df["engine"].unique()):
        groups[f"engine {engine}"] = df["engine"] == engine
    return {name: {"in_sample": stats(df.loc[mask, "fitted_error"]), "cross_validated": stats(df.loc[mask, "cv_error"])}
            for name, mask in groups.items()}


def params_table(result: FitResult) -> list[dict[str, Any]]:
    out = []
    for n, p in enumerate(result.params):
        folds = [v[n] for v in result.fold_values]
        out.append({"name": p.name, "start": result.start[n], "fitted": result.values[n], "low": p.low,
                    "high": p.high, "fold_min": min(folds) if folds else math.nan,
                    "fold_max": max(folds) if folds else math.nan, "bounds_source": p.source})
    return out


def outcomes_table(result: FitResult) -> list[dict[str, Any]]:
    """How each fit ended: the in-sample fit, then each fold's (sim.studies.fit_checkpoint.Outcome)."""
    names = ["in-sample"] + [f"fold {f + 1}" for f in range(len(result.outcomes) - 1)]
    return [{"fit": name, "converged": o.converged, "iterations": o.iterations, "loss": o.cost, "start": o.start,
             "sweeps": o.sweeps} for name, o in zip(names, result.outcomes, strict=True)]


def outcomes_line(result: FitResult) -> str:
    """One sentence for the report: whether the fits converged or stopped at the cap (a fit
    that stopped there sits between its start and its optimum, so its figures depend on
    where it started)."""
    rows = outcomes_table(result)
    if not rows:
        return ""
    parts = [f"{r['fit']} {'converged' if r['converged'] else 'stopped at the iteration cap'} "
             f"({r['iterations']} steps{', from the ' + r['start'] + ' start' if r['start'] else ''}"
             f"{', ' + str(r['sweeps']) + ' sweeps' if r['sweeps'] else ''}, loss {r['loss']:.4g})" for r in rows]
    return " ".join(filter(None, ["Fits: " + "; ".join(parts) + ".", starts_line(result)]))


def starts_line(result: FitResult) -> str:
    """Where the fits started: the folds from the priors (values no row was fitted to), the
    in-sample fit from the catalog's values or from the priors too; and, with the ideal
    start, that each fit kept the lower loss of two starts."""
    line = _first_starts(result)
    if result.ideal:
        line += (" Each fit also ran from the ideal start (host-software costs at their floors, fabrics and "
                 "host CPUs at their ceilings) and kept whichever ended at the lower loss on its own rows.")
    if result.sweeps:
        line += (f" Each kept fit then ran up to {result.sweeps} rounds of coordinate sweeps on its own rows "
                 "(every free parameter tried at 5 points of its range, the lowest loss kept where it gains at least "
                 f"{SWEEP_MOVE_GAIN:.1%}).")
    return line


def _first_starts(result: FitResult) -> str:
    if not result.fold_values:
        from_priors = result.folds_from_priors and result.start == result.fold_start
        return "No folds: the fit started from the priors." if from_priors else \
            "No folds: the fit started from the catalog's values."
    if not result.folds_from_priors:
        return "Every fit started from the catalog's values (no priors read)."
    if result.start == result.fold_start:
        return "Every fit started from the priors."
    return "The in-sample fit started from the catalog's values, the folds from the priors."


def _pct(x: float) -> str:
    return "" if math.isnan(x) else f"{100 * x:+.1f}"


def _cell(x: float, signed: bool = False) -> str:
    """A share as a table cell; empty where there is none (no folds: no CV figures)."""
    if math.isnan(x):
        return ""
    return f"{_pct(x)}%" if signed else f"{100 * x:.1f}%"


def markdown(df: pd.DataFrame, result: FitResult, csvs: Sequence[str]) -> str:
    """The generated block of docs/fidelity.md: statistics, parameters, every row."""
    lines = [BEGIN, "", f"Generated by `zerosim fit` from {', '.join(f'`{Path(c).name}`' for c in csvs)}: "
             f"{len(df)} usable rows, {result.simulations} simulations, soft-L1 knee {result.knee:g}"
             f"{', exact trust-region steps' if result.solver == 'exact' else ''}"
             f"{', ranges of a decade or more on a log scale' if result.scale == 'log' else ''}. "
             f"{outcomes_line(result)}".rstrip(), "",
             "| rows | n | in-sample median abs | in-sample worst abs | in-sample median signed "
             "| CV median abs | CV worst abs | CV median signed |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, both in summary(df).items():
        a, c = both["in_sample"], both["cross_validated"]
        if a["rows"] == 0:
            continue
        cells = [_cell(a["median_abs"]), _cell(a["worst_abs"]), _cell(a["median_signed"], signed=True),
                 _cell(c["median_abs"]), _cell(c["worst_abs"]), _cell(c["median_signed"], signed=True)]
        lines.append(f"| {name} | {a['rows']} | " + " | ".join(cells) + " |")
    lines += ["", "| parameter | catalog | fitted | fold range | bounds | bounds from |", "| --- | --- | --- | --- | --- | --- |"]
    for p in params_table(result):
        folds = "" if math.isnan(p["fold_min"]) else f"{p['fold_min']:.4g}-{p['fold_max']:.4g}"
        lines.append(f"| {p['name']} | {p['start']:.4g} | {p['fitted']:.4g} | {folds} | {p['low']:g}-{p['high']:g} "
                     f"| {p['bounds_source']} |")
    lines += ["", "| id | source | model | GPUs | tp/pp/dp | engine | micro/global | published s | fitted s "
              "| error % | CV s | CV error % |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in df.to_dict(orient="records"):
        fitted = "not simulated" if math.isnan(row["fitted_s"]) else f"{row['fitted_s']:.3f}"
        cv = "" if math.isnan(row["cv_s"]) else f"{row['cv_s']:.3f}"
        lines.append(f"| {row['id']} | {row['source']} | {str(row['model'])[:32]} | {row['gpus']} | {row['layout']} "
                     f"| {row['engine']} | {row['micro_global']} | {row['published_s']:.3f} | {fitted} "
                     f"| {_pct(row['fitted_error'])} | {cv} | {_pct(row['cv_error'])} |")
    return "\n".join(lines + ["", END])


def replace_block(text: str, block: str) -> str:
    """`text` with the part between the fit markers replaced by `block` (appended when absent)."""
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    return pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"


def plot(df: pd.DataFrame, path: Path) -> None:
    """Predicted (cross-validated where available) against published step time, log-log,
    one marker per engine, with the +-10% and +-25% bands."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 5.6))
    pred = df["cv_s"].where(df["cv_s"].notna(), df["fitted_s"])
    ok = pred.notna()
    lo, hi = 0.5 * df.loc[ok, "published_s"].min(), 2.0 * df.loc[ok, "published_s"].max()
    xs = [lo, hi]
    ax.plot(xs, xs, color="black", lw=1)
    for band, style in ((0.10, ":"), (0.25, "--")):
        for sign in (1, -1):
            ax.plot(xs, [x * (1 + sign * band) for x in xs], color="grey", lw=0.8, ls=style)
    for engine, part in df[ok].groupby("engine"):
        ax.scatter(part["published_s"], pred[part.index], label=engine, s=22)
    ax.set(xscale="log", yscale="log", xlim=xs, ylim=xs, xlabel="published step time (s)",
           ylabel="zerosim step time, cross-validated (s)",
           title="zerosim vs published step times (lines: +-10%, +-25%)")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
