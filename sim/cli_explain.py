"""`zerosim explain SCENARIO`: arguments, the command and its text (sim.studies.explain does
the work)."""

from __future__ import annotations

import argparse

from sim.cli_checks import CLI, check_output_path, image_suffixes, scenario_path, strict_json, written
from sim.core.errors import InputError
from sim.results.plots import save_explain_plot
from sim.studies.explain import HIDDEN, PARTLY, Explanation, Finding, explain

GB = 1e9


def add_explain_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="scenario TOML file, or a bundled scenario's name")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--no-search", action="store_true", help="only the class table (no DES searches)")
    p.add_argument("--plot", metavar="OUT.png", help="draw exposed time against tokens per GPU and against "
                   "bandwidth from the searches (.png, .svg, ...)")


def cmd_explain(args: argparse.Namespace) -> int:
    plot = check_output_path(args.plot, "--plot", image_suffixes()) if args.plot else None
    if plot and args.no_search:
        raise InputError(CLI, "--plot", "draws the searches' points; allowed: without --no-search")
    path = scenario_path(args.scenario)
    result = explain(path, search=not args.no_search)
    if plot:
        written(plot, "--plot", lambda p: save_explain_plot(result, str(p)))
    print(strict_json(result.to_json(), path, indent=2, sort_keys=True) if args.json else format_explanation(result))
    return 0


def format_explanation(e: Explanation) -> str:
    lines = [f"{e.scenario}: step {e.step_time_s:.4f} s; verdict: hidden if >= {100 * HIDDEN:.0f}% of a class's "
             f"busy time is hidden behind compute, partly hidden from {100 * PARTLY:.0f}%, else exposed",
             f"{'class':22s}{'busy s':>10s}{'hidden s':>10s}{'exposed s':>11s}{'of step':>9s}  verdict"]
    for c in e.classes:
        lines.append(f"{c.name:22s}{c.busy_s:10.4f}{c.hidden_s:10.4f}{c.exposed_s:11.4f}"
                     f"{100 * c.exposed_s / e.step_time_s:8.1f}%  {c.verdict}")
        found = e.findings.get(c.name)
        if found:
            lines.append(f"  to hide >= {100 * HIDDEN:.0f}%: " + "; ".join(_finding(f) for f in found))
    lines += [f"note: {n}" for n in e.notes]
    return "\n".join(lines)


def _finding(f: Finding) -> str:
    if f.value is None:
        return f"{f.what}: {f.note}"
    cost = f" (peak {f.peak_bytes / GB:.1f} GB, {'fits' if f.fits else 'does NOT fit'})" if f.peak_bytes else ""
    if f.what == "micro_batch":
        return f"micro-batch {f.value:g} ({f.tokens_per_gpu:,.0f} tokens per GPU per step){cost}"
    if f.what.startswith("comm.busbw_GBps"):
        return f"{f.what} >= {f.value:.3g} GB/s"
    return f"{f.what} = {f.value:g}{cost}"
