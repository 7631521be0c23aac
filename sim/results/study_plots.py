"""Figures of many simulations (a `zerosim sweep` or `zerosim search` table) and of one
step (a per-rank timeline). Each function takes a matplotlib Axes, draws and returns it;
nothing touches pyplot's global state. `save_table_plot` / `save_timeline` render to a file
(PNG, SVG, PDF: matplotlib picks the format by the suffix).

The table functions read the sweep's columns (sim.studies.sweep): `gpus`, `strategy`,
`tokens_per_s`, `tflops_per_gpu`, `tokens_per_gpu`, the `time` fields, the `memory` fields;
rows without a result (infeasible points) are skipped, rows that do not fit are drawn
hollow (their numbers are what the simulator found before it ran out of memory)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from sim.results.step import SimulationResult

GB = 1e9
TIME_PARTS = (("compute", "compute_s"), ("exposed communication", "exposed_comm_s"),
              ("exposed offload", "exposed_offload_s"), ("pipeline bubble", "bubble_s"),
              ("optimizer", "optimizer_s"), ("exposed host", "exposed_host_s"))
MEMORY_PARTS = (("parameters", "params_bytes"), ("gradients", "grads_bytes"), ("optimizer states", "optimizer_bytes"),
                ("activations", "activations_bytes"), ("buffers", "buffers_bytes"))
KINDS = ("throughput", "tflops", "breakdown", "memory", "exposed")
RESULT_COLUMNS = {"step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "fits", "compute_s", "peak_bytes"}


def _simulated(df: pd.DataFrame) -> pd.DataFrame:
    """The rows with a result, fitting or not."""
    if "feasible" in df.columns:
        df = df[df["feasible"].astype(bool)]
    return df.dropna(subset=["step_time_s"]) if "step_time_s" in df.columns else df


def labels(df: pd.DataFrame, columns: Sequence[str] | None = None) -> list[str]:
    """One short label per row: the varied columns (`columns`, or those not in the results
    contract) as key=value, else the strategy and layout."""
    if columns is None:
        columns = [c for c in df.columns if "." in c or c == "nodes"]
    if columns:
        return [", ".join(f"{c.split('.')[-1]}={row[c]}" for c in columns) for _, row in df.iterrows()]
    return [f"{row.get('strategy', '')} {row.get('layout', '')}".strip() for _, row in df.iterrows()]


def _lines(ax: Axes, df: pd.DataFrame, x: str, y: str, by: str, scale: float = 1.0) -> Axes:
    """One line per value of `by`, sorted by `x`; points that do not fit drawn hollow."""
    for key, part in _simulated(df).groupby(by, sort=True):
        part = part.sort_values(x)
        line, = ax.plot(part[x], part[y] / scale, marker="o", label=str(key))
        if "fits" in part.columns:
            bad = part[~part["fits"].astype(bool)]
            if not bad.empty:
                ax.plot(bad[x], bad[y] / scale, linestyle="none", marker="o", markersize=9, markerfacecolor="white",
                        markeredgecolor=line.get_color(), markeredgewidth=1.5, zorder=3)
    ax.legend(fontsize=8, title=by)
    ax.grid(alpha=0.3)
    return ax


def throughput_vs_gpus(ax: Axes, df: pd.DataFrame, *, by: str = "strategy") -> Axes:
    """Whole-job tokens per second against the number of GPUs, one line per `by` value
    (log-log: a straight line of slope 1 is linear scaling)."""
    _lines(ax, df, "gpus", "tokens_per_s", by)
    ax.set(xscale="log", yscale="log", xlabel="GPUs", ylabel="tokens / s (job)",
           title="throughput against GPUs (hollow: does not fit)")
    return ax


def tflops_vs_gpus(ax: Axes, df: pd.DataFrame, *, by: str = "strategy") -> Axes:
    """Model TFLOP/s per GPU against the number of GPUs, one line per `by` value."""
    _lines(ax, df, "gpus", "tflops_per_gpu", by)
    ax.set(xscale="log", xlabel="GPUs", ylabel="model TFLOP/s per GPU", title="TFLOP/s per GPU against GPUs")
    ax.set_ylim(bottom=0)
    return ax


def exposed_vs_tokens(ax: Axes, df: pd.DataFrame, *, by: str = "strategy") -> Axes:
    """Exposed communication per step against tokens per GPU per step, one line per `by`."""
    _lines(ax, df, "tokens_per_gpu", "exposed_comm_s", by)
    ax.set(xscale="log", xlabel="tokens per GPU per step", ylabel="exposed communication (s per step)",
           title="exposed communication against tokens per GPU")
    ax.set_ylim(bottom=0)
    return ax


def _stacked(ax: Axes, df: pd.DataFrame, parts: Sequence[tuple[str, str]], scale: float,
             columns: Sequence[str] | None) -> Axes:
    rows = _simulated(df)
    names = labels(rows, columns)
    bottom = [0.0] * len(rows)
    for name, column in parts:
        if column not in rows.columns:
            continue
        values = [float(v) / scale for v in rows[column].fillna(0.0)]
        if any(values):
            ax.bar(range(len(rows)), values, bottom=bottom, label=name)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_xticks(range(len(rows)), names, rotation=30, ha="right", fontsize=8)
    ax.legend(fontsize=8)
    return ax


def step_breakdown(ax: Axes, df: pd.DataFrame, *, columns: Sequence[str] | None = None) -> Axes:
    """Stacked bars per configuration: where the step's time goes (compute, exposed
    communication, exposed offload, bubble, optimizer, exposed host; sim.results.attribution)."""
    _stacked(ax, df, TIME_PARTS, 1.0, columns)
    ax.set(ylabel="seconds per step", title="step time by part")
    return ax


def memory_by_configuration(ax: Axes, df: pd.DataFrame, *, columns: Sequence[str] | None = None) -> Axes:
    """Stacked bars per configuration: peak memory of the fullest GPU by category."""
    _stacked(ax, df, MEMORY_PARTS, GB, columns)
    ax.set(ylabel="GB per GPU (at the peak)", title="memory by category")
    return ax


def timeline(ax: Axes, result: SimulationResult, *, ranks: Sequence[int] | None = None) -> Axes:
    """One lane per (rank, stream) of the last simulated step, an op a bar coloured by its
    kind (compute, collective, copy, CPU optimizer, ...)."""
    spans = [sp for sp in result.engine.spans if (ranks is None or sp.rank in ranks) and sp.end > sp.start]
    lanes = sorted({(sp.rank, sp.op.stream.value) for sp in spans})
    lane = {key: i for i, key in enumerate(lanes)}
    start = min((sp.start for sp in spans), default=0.0)
    cycle = [c["color"] for c in matplotlib_cycle()]
    for k, kind in enumerate(sorted({sp.op.kind.value for sp in spans})):
        colour = cycle[k % len(cycle)]
        by_lane: dict[int, list[tuple[float, float]]] = {}
        for sp in spans:
            if sp.op.kind.value == kind:
                by_lane.setdefault(lane[(sp.rank, sp.op.stream.value)], []).append((sp.start - start, sp.end - sp.start))
        for i, (y, bars) in enumerate(sorted(by_lane.items())):
            ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=colour, label=kind if i == 0 else None)
    ax.set_yticks(range(len(lanes)), [f"rank {r} {stream}" for r, stream in lanes], fontsize=7)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set(xlabel="seconds into the step", title=f"{result.scenario.name}: one step")
    ax.legend(fontsize=7, loc="lower right")
    return ax


def matplotlib_cycle() -> list[dict[str, Any]]:
    from matplotlib import rcParams
    return list(rcParams["axes.prop_cycle"])


DRAW = {"throughput": throughput_vs_gpus, "tflops": tflops_vs_gpus, "exposed": exposed_vs_tokens}


def save_table_plot(df: pd.DataFrame, kind: str, path: str, *, by: str = "strategy",
                    columns: Sequence[str] | None = None) -> None:
    """Render one `kind` of figure of a sweep / search table to `path` (Agg backend)."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.8), dpi=100)
    ax = fig.add_subplot()
    if kind in DRAW:
        DRAW[kind](ax, df, by=by)
    elif kind == "breakdown":
        step_breakdown(ax, df, columns=columns)
    else:
        memory_by_configuration(ax, df, columns=columns)
    fig.tight_layout()
    fig.savefig(path)


def save_timeline(result: SimulationResult, path: str, ranks: Sequence[int] | None = None) -> None:
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    lanes = len({(sp.rank, sp.op.stream) for sp in result.engine.spans if ranks is None or sp.rank in ranks})
    fig = Figure(figsize=(10, 1.2 + 0.3 * lanes), dpi=100)
    timeline(fig.add_subplot(), result, ranks=ranks)
    fig.tight_layout()
    fig.savefig(path)
