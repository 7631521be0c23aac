"""matplotlib figures. Each function takes an Axes, draws on it and returns it; nothing here
touches pyplot's global state, so callers compose figures as they like."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sim.results.memory_report import MemoryReport

if TYPE_CHECKING:
    from matplotlib.axes import Axes

GB = 1e9
COMPONENTS = (("parameters", "params_bytes"), ("gradients", "grads_bytes"),
              ("optimizer states", "optimizer_bytes"), ("activations", "activations_bytes"),
              ("buffers", "buffers_bytes"), ("fragmentation", "fragmentation_bytes"))


def memory_breakdown(ax: Axes, report: MemoryReport) -> Axes:
    """Stacked bars: per-GPU memory by component for each ZeRO stage, with device memory."""
    labels = [row.label for row in report.rows]
    bottom = [0.0] * len(report.rows)
    for name, attr in COMPONENTS:
        values = [getattr(row, attr) / GB for row in report.rows]
        if any(values):
            ax.bar(labels, values, bottom=bottom, label=name)
            bottom = [b + v for b, v in zip(bottom, values)]
    if report.device_memory_bytes:
        ax.axhline(report.device_memory_bytes / GB, color="black", linestyle="--", linewidth=1,
                   label=f"device memory ({report.device_memory_bytes / GB:.0f} GB)")
    if report.this_stage is not None:
        ax.get_xticklabels()[report.this_stage].set_fontweight("bold")
    ax.set_ylabel("GB per GPU")
    ax.set_title(report.title.split(", tp")[0].split(": ")[-1], fontsize=10)
    ax.legend(fontsize=8)
    return ax


def save_memory_plot(report: MemoryReport, path: str) -> None:
    """Render `memory_breakdown` to a PNG (the CLI's --plot); uses the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5), dpi=100)
    memory_breakdown(fig.add_subplot(), report)
    fig.tight_layout()
    fig.savefig(path)


def save_explain_plot(explanation: Any, path: str) -> None:
    """`zerosim explain --plot`: each searched class's exposed time against tokens per GPU per
    step (the micro-batch search) and against the bus bandwidth (the bandwidth search), from
    the DES runs the searches made (sim.studies.explain); uses the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), dpi=100)
    tokens_ax, bandwidth_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for name, findings in explanation.findings.items():
        for f in findings:
            if not f.points:
                continue
            ax = tokens_ax if f.what == "micro_batch" else bandwidth_ax if f.what.startswith("comm.") else None
            if ax is not None:
                xs, ys = zip(*f.points, strict=True)
                ax.plot(xs, ys, marker="o", label=name)
    for ax, label in ((tokens_ax, "tokens per GPU per step"), (bandwidth_ax, "bus bandwidth of the group (GB/s)")):
        ax.set_xscale("log", base=2 if ax is tokens_ax else 10)
        ax.set_xlabel(label)
        ax.set_ylabel("exposed time per step (s)")
        if ax.lines:
            ax.legend(fontsize=8)
    fig.suptitle(f"{explanation.scenario}: what hides each class (zerosim explain)")
    fig.tight_layout()
    fig.savefig(path)
