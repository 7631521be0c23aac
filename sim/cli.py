"""The `zerosim` command: argparse subcommands that call plain functions.

Exit status (design.md): 0 done and fits; 3 computed but does not fit; 2 bad input,
with a one-line message on stderr naming the file and key. Only this module writes output.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from sim.cli_checks import (
    CLI,
    COUNT_UNITS,
    MAX_DEVICE_MEMORY,
    MAX_K,
    MAX_PARAMS,
    SIZE_UNITS,
    check_finite,
    check_int,
    check_number,
    check_output_path,
    image_suffixes,
    parse_quantity,
    scenario_path,
    strict_json,
    written,
)
from sim.cli_explain import add_explain_args, cmd_explain
from sim.cli_fit import add_fit_args, cmd_fit
from sim.cli_plot import add_plot_args, cmd_plot
from sim.cli_search import add_search_args, cmd_search
from sim.cli_sweep import add_sweep_args, cmd_sweep
from sim.core import limits as L
from sim.core.enums import Convention
from sim.core.errors import InputError
from sim.des.engine import Mode
from sim.inputs.catalog import KINDS, catalog_names
from sim.inputs.load import load_scenario
from sim.results.memory_report import quick_report, scenario_report
from sim.results.memory_text import format_memory
from sim.results.plots import save_memory_plot
from sim.results.run_text import format_run
from sim.results.tables import event_table
from sim.results.trace import write_chrome_trace
from sim.simulate import simulate
from sim.studies.check import check_rows, holds
from sim.studies.fit_params import bound_notes
from sim.validate.cli_args import add_calibrate_args, add_validate_args

EXIT_OK, EXIT_BAD_INPUT, EXIT_DOES_NOT_FIT = 0, 2, 3


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (an InputError), not a usage block and exit."""

    def error(self, message: str) -> NoReturn:
        raise InputError(CLI, self.prog, f"{message}; see `{self.prog} --help`")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="zerosim", description="Performance simulator for "
                                     "distributed LLM training (DeepSpeed ZeRO, FSDP2, 3D parallelism).")
    sub = parser.add_subparsers(dest="command", required=True)
    mem = sub.add_parser("memory", help="per-GPU memory by ZeRO stage and component; largest model",
                         description="Per-GPU memory table for a scenario, or for --params/--dp.")
    mem.add_argument("scenario", nargs="?", help="scenario TOML file, or a bundled scenario's name")
    mem.add_argument("--params", help="parameter count for a quick question, e.g. 7.5e9 or 7.5B")
    mem.add_argument("--dp", type=int, default=None, help="data-parallel degree (with --params; default 1)")
    mem.add_argument("--gpu-memory", help="device memory, e.g. 32GB or 80GiB (with --params)")
    mem.add_argument("--largest-module", help="largest module's parameters (deepspeed convention, stage 3)")
    mem.add_argument("--k", type=float, default=12.0, help="optimizer bytes per parameter K (paper)")
    mem.add_argument("--convention", choices=[c.value for c in Convention], default=None,
                     help="paper (K = 12), lecture (20 B/param), deepspeed (its estimators) or "
                          "allocated (what the engine holds); default: allocated for a "
                          "scenario, paper for --params")
    mem.add_argument("--fragmentation", type=float, default=0.0,
                     help="allocator fragmentation allowance as a fraction of activations + buffers")
    mem.add_argument("--json", action="store_true", help="print one JSON object")
    mem.add_argument("--plot", metavar="PNG", help="also draw the breakdown by stage to this image file "
                     "(.png, .pdf, .svg, ...)")
    run = sub.add_parser("run", help="simulate a training step: time, MFU, exposed communication, memory",
                         description="Simulate optimizer steps of a scenario with the discrete-event engine.")
    run.add_argument("scenario", help="scenario TOML file, or a bundled scenario's name")
    run.add_argument("--json", action="store_true", help="print one JSON object (the results contract)")
    run.add_argument("--trace", metavar="OUT.json", help="write a Chrome / Perfetto trace")
    run.add_argument("--steps", type=int, default=1, help="optimizer steps to simulate (default 1; the "
                     "last one is reported)")
    run.add_argument("--mode", choices=[m.value for m in Mode], default="representative",
                     help="simulate one rank per symmetry class, or every rank")
    run.add_argument("--events", metavar="OUT.csv", help="write the tidy event table (pandas) as CSV")
    chk = sub.add_parser("check", help="DES vs analytic twin, side by side")
    chk.add_argument("scenarios", nargs="+", help="scenario files or bundled names")
    cal = sub.add_parser("calibrate", help="measure this machine (gloo collectives, GEMM, memory) into a profile",
                         description="Measure gloo collectives and CPU compute with 2 and 4 processes, fit "
                                     "alpha-beta per collective, write hardware profiles (needs torch).")
    add_calibrate_args(cal)
    val = sub.add_parser("validate", help="real torch runs (gloo, CPU) against the planner; timing with a profile",
                         description="Run DDP, ZeroRedundancyOptimizer and FSDP2 on gloo and compare their "
                                     "collectives and memory with the planner's (needs torch).")
    add_validate_args(val)
    fit = sub.add_parser("fit", help="fit the clock's physical parameters to published step times (k-fold CV)",
                         description="Fit GPU, network and host parameters to published-measurement CSVs "
                                     "(shared/validation format) with the DES; report in-sample and "
                                     "cross-validated errors per row; optionally write fitted hardware files.")
    add_fit_args(fit)
    exp = sub.add_parser("explain", help="per communication / offload class: busy, hidden, exposed, verdict, "
                         "and what would hide it", description="Which communication and offload is hidden behind "
                         "compute, and the micro-batch, bandwidth and prefetch / bucket that would hide it (DES "
                         "searches on variants of the scenario).")
    add_explain_args(exp)
    swp = sub.add_parser("sweep", help="simulate the product of scenario-key values: one row per point",
                         description="Vary scenario keys (dotted, as in the file) over their values, simulate "
                                     "every combination in parallel and print / write the table (pandas).")
    add_sweep_args(swp)
    plt = sub.add_parser("plot", help="figures of a sweep / search table, or a one-step timeline of a scenario",
                         description="Throughput or TFLOP/s against GPUs per strategy, step-time and memory "
                                     "breakdowns, exposed communication against tokens per GPU (from a "
                                     "zerosim sweep / search table), or a per-rank timeline of one step.")
    add_plot_args(plt)
    sea = sub.add_parser("search", help="the fastest layouts (tp, pp, dp, micro-batch, recompute, engine) that fit",
                         description="Enumerate layouts for the scenario's model, cluster and global batch, prune "
                                     "with the analytic twin (memory, lower bounds on time), simulate the rest by "
                                     "branch and bound and rank them; every rejected layout has its reason.")
    add_search_args(sea)
    cat = sub.add_parser("catalog", help="list bundled models, hardware and scenarios")
    cat.add_argument("kind", nargs="?", choices=KINDS)
    return parser



def cmd_memory(args: argparse.Namespace) -> int:
    if (args.scenario is None) == (args.params is None):
        raise InputError(CLI, "scenario", "give either a scenario file or --params (exactly one)")
    plot = check_output_path(args.plot, "--plot", image_suffixes()) if args.plot else None
    fragmentation = check_number(args.fragmentation, "--fragmentation", low=0, high=1, high_open=True)
    if args.scenario is not None:
        for flag in ("gpu_memory", "largest_module", "dp"):
            if getattr(args, flag) is not None:
                raise InputError(CLI, "--" + flag.replace("_", "-"),
                                 "only with --params (a scenario names its cluster, model and layout)")
        source: str | Path = scenario_path(args.scenario)
        report = scenario_report(load_scenario(Path(source)), convention=Convention(args.convention or "allocated"),
                                 fragmentation=fragmentation)
    else:
        source = CLI
        params, dp, memory, largest = _quick_question(args)
        report = quick_report(params, dp, convention=Convention(args.convention or "paper"),
                              device_memory=memory, largest_module=largest,
                              k=check_number(args.k, "--k", low=0, high=MAX_K))
    out = report.to_json()
    check_finite(out, source)
    if plot:
        written(plot, "--plot", lambda p: save_memory_plot(report, str(p)))
    print(strict_json(out, source, indent=2) if args.json else format_memory(report))
    return EXIT_DOES_NOT_FIT if report.fits is False else EXIT_OK


def _quick_question(args: argparse.Namespace) -> tuple[float, int, float | None, float]:
    """(parameters, dp, device memory or None, largest module) from the --params form."""
    params = parse_quantity(args.params, COUNT_UNITS, "--params", maximum=MAX_PARAMS)
    dp = check_int(1 if args.dp is None else args.dp, "--dp", low=1, high=L.MAX_WORLD)
    memory = None
    if args.gpu_memory is not None:
        memory = parse_quantity(args.gpu_memory, SIZE_UNITS, "--gpu-memory", maximum=MAX_DEVICE_MEMORY)
    largest = 0.0
    if args.largest_module is not None:
        largest = parse_quantity(args.largest_module, COUNT_UNITS, "--largest-module", maximum=MAX_PARAMS)
        if largest > params:
            raise InputError(CLI, "--largest-module", f"{largest:g} parameters is more than the whole model "
                             f"(--params {params:g}); allowed: at most --params")
    return params, dp, memory, largest


def cmd_run(args: argparse.Namespace) -> int:
    steps = check_int(args.steps, "--steps", low=1, high=L.MAX_STEPS)
    trace = check_output_path(args.trace, "--trace", ("json",)) if args.trace else None
    events = check_output_path(args.events, "--events", ("csv",)) if args.events else None
    path = scenario_path(args.scenario)
    scenario = load_scenario(path)
    result = simulate(scenario, steps=steps, mode=Mode(args.mode))
    report = result.to_json()
    check_finite(report, path)
    report["notes"] = list(report["notes"]) + bound_notes(scenario)
    if trace:
        written(trace, "--trace", lambda p: write_chrome_trace(result, str(p)))
    if events:
        written(events, "--events", lambda p: event_table(result).to_csv(p, index=False))
    print(strict_json(report, path, indent=2, sort_keys=True) if args.json else format_run(report, scenario.question))
    return EXIT_OK if result.fits else EXIT_DOES_NOT_FIT


def cmd_check(args: argparse.Namespace) -> int:
    failed = 0
    for arg in args.scenarios:
        result = simulate(load_scenario(scenario_path(arg)))
        print(f"{result.scenario.name}")
        print(f"  {'quantity':44s}{'DES':>18s}{'analytic':>18s}  ok")
        for name, des, analytic, rel in check_rows(result):
            ok = holds(des, analytic, rel)
            failed += not ok
            print(f"  {name:44s}{des:18.6g}{analytic:18.6g}  {'yes' if ok else 'NO'}")
    return EXIT_OK if not failed else 1


def cmd_catalog(args: argparse.Namespace) -> int:
    for kind in [args.kind] if args.kind else KINDS:
        print(f"{kind}: {', '.join(catalog_names(kind))}")
    return EXIT_OK


def cmd_validation(args: argparse.Namespace) -> int:
    """calibrate / validate need torch: imported only when asked for."""
    try:
        from sim.validate import commands
    except ImportError as error:
        raise InputError(CLI, args.command, f"needs torch ({error}); allowed: install "
                         "zerosim with the validate extra: pip install '.[validate]'") from None
    return commands.cmd_calibrate(args) if args.command == "calibrate" else commands.cmd_validate(args)


COMMANDS = {"memory": cmd_memory, "run": cmd_run, "check": cmd_check, "catalog": cmd_catalog, "fit": cmd_fit,
            "sweep": cmd_sweep, "plot": cmd_plot, "search": cmd_search, "explain": cmd_explain, "calibrate": cmd_validation, "validate": cmd_validation}


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except InputError as error:
        print(f"zerosim: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
