"""`zerosim calibrate` and `zerosim validate` (torch is imported here, not by `sim.cli`).

Both check their options first (sim.validate.checks), then run with a deadline per torch run
(--timeout) and, unless --verbose, with every library message in one log file
(sim.validate.output): the terminal shows the command's own lines and the log's path.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from sim.core.errors import InputError
from sim.validate.build_locks import check_build_locks
from sim.validate.calibrate import SIZES, calibrate
from sim.validate.checks import check_calibrate_args, check_validate_args
from sim.validate.compare import planned, planned_state, recorded, validation_scenario
from sim.validate.output import command_output
from sim.validate.timing import STRATEGIES, TIMING_MODEL, TIMING_RUN, predicted_vs_measured, profile_for
from sim.validate.torch_runs import RunTimeout, run_settings, spawn

SEQUENCE_MODEL = {"layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2, "ffn_hidden": 384, "vocab": 2048}
DEFAULT_PROFILE_DIR = Path.home() / ".cache" / "zerosim" / "calibrated"


def _has_deepspeed() -> bool:
    return importlib.util.find_spec("deepspeed") is not None   # without importing it (and its warnings)


@contextlib.contextmanager
def _runs(command: str, args: argparse.Namespace) -> Iterator[TextIO]:
    """Quiet output (unless --verbose), the --timeout of every torch run, and a run that
    timed out reported in one line."""
    with command_output(command, args.log, args.verbose) as (out, log), \
            run_settings(timeout_s=args.timeout, log=log):
        try:
            yield out
        except RunTimeout as error:
            raise InputError("torch run", "", str(error)) from None


def cmd_calibrate(args: argparse.Namespace) -> int:
    check_calibrate_args(args)
    if args.device and _has_deepspeed():
        check_build_locks()   # DeepSpeedCPUAdam is built just in time
    with _runs("calibrate", args) as out:
        if args.device:
            return _calibrate_device(args, out)
        sizes = tuple(s for s in SIZES if s <= args.max_size_MiB * 2**20)
        tokens = TIMING_RUN["seq_len"] * TIMING_RUN["micro_batch"]
        results = calibrate(Path(args.out), worlds=tuple(args.worlds), sizes=sizes, model=TIMING_MODEL, tokens=tokens,
                            seq_len=TIMING_RUN["seq_len"])
        for world, r in sorted(results.items()):
            c = r["compute"]
            hooks = ", ".join(f"{e} hook {s * 1e6:.0f} us" for e, s in sorted(r["hooks"].items()))
            print(f"{world} processes: GEMM {c['gemm_flops'] / 1e9:.1f} GFLOP/s, DRAM "
                  f"{c['memory_bandwidth'] / 1e9:.2f} GB/s, elementwise {c['elementwise_bandwidth'] / 1e9:.2f} GB/s "
                  f"(the model's memory-bound kernels at {c['memory_efficiency']:.2f} of it), "
                  f"kernel overhead {c['kernel_overhead'] * 1e6:.1f} us, interference {c['comm_interference']:.2f}, "
                  f"{hooks} -> {r['path']}", file=out)
            for op, (alpha, busbw) in sorted(r["fits"].items()):
                print(f"  {op:15s} alpha {alpha * 1e6:9.1f} us/step   busbw {busbw / 1e9:8.3f} GB/s", file=out)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    check_validate_args(args)
    deepspeed = _has_deepspeed()
    if deepspeed:
        check_build_locks()   # DeepSpeed builds some ops just in time
    with _runs("validate", args) as out:
        return _validate(args, out, deepspeed)


def _validate(args: argparse.Namespace, out: TextIO, deepspeed: bool) -> int:
    failures = 0
    print(f"{'strategy':26s}{'world':>6s}{'accum':>6s}  sequence  memory", file=out)
    deepspeed_runs = [f"deepspeed-zero{k}" for k in range(4)] if deepspeed else []
    if not deepspeed:
        print("(deepspeed is not installed: its runs are skipped)", file=out)
    for world in args.worlds:
        accum = 1 if world == 2 else 2
        for strategy in [*STRATEGIES, *deepspeed_runs]:
            cfg = {"model": SEQUENCE_MODEL, "seq_len": 32, "micro_batch": 2, "grad_accum": accum, "steps": 3,
                   "strategy": strategy, "zero": {"stage": int(strategy[-1])} if strategy in deepspeed_runs else None}
            worker = "train_deepspeed" if strategy in deepspeed_runs else "train_llama"
            ranks = spawn(world, worker, cfg)
            s = validation_scenario(strategy, SEQUENCE_MODEL, world, seq_len=32, micro_batch=2, grad_accum=accum)
            same = all(recorded(r["log"], 2) == planned(s) for r in ranks)
            plan = planned_state(s)
            if strategy in deepspeed_runs:   # DeepSpeed: the ZeRO optimizer's bytes (none without ZeRO)
                memory = strategy.endswith("0") or {r["optimizer_bytes"] for r in ranks} == {plan["optimizer"]}
            else:
                memory = {k: max(r["state"][k] for r in ranks) for k in plan} == plan
            failures += (not same) + (not memory)
            print(f"{strategy:26s}{world:6d}{accum:6d}  {'match' if same else 'DIFFER':8s}  "
                  f"{'match' if memory else 'DIFFER'}", file=out)
    if importlib.util.find_spec("transformers") is not None:
        for world in args.worlds:
            failures += _validate_hf(world, 1 if world == 2 else 2, out)
    else:
        print("(transformers is not installed: the Hugging Face model's runs are skipped)", file=out)
    if args.profile_dir:
        print(f"\n{'strategy':22s}{'world':>6s}{'measured s':>12s}{'predicted s':>13s}{'error':>8s}"
              f"{'speed':>8s}{'adjusted':>10s}", file=out)
        for world in args.worlds:
            for row in predicted_vs_measured(profile_for(Path(args.profile_dir), world), world):
                print(f"{row['strategy']:22s}{world:6d}{row['measured_s']:12.4f}{row['predicted_s']:13.4f}"
                      f"{100 * row['error']:7.1f}%{row['speed']:8.2f}{100 * row['adjusted_error']:9.1f}%", file=out)
    return 1 if failures else 0


HF_CASES = {   # row label: (strategy, options of the run and of its scenario)
    "hf ddp": ("ddp", {}), "hf ddp-zero-redundancy": ("ddp-zero-redundancy", {}),
    "hf fsdp2": ("fsdp2", {}), "hf fsdp2 +root": ("fsdp2", {"reshard_root": True}),
    "hf fsdp2-no-reshard +root": ("fsdp2-no-reshard", {"reshard_root": True}),
}


def _validate_hf(world: int, accum: int, out: TextIO) -> int:
    """transformers' LlamaForCausalLM (rotary buffers; FSDP2 root resharded or not) in one
    process group; returns the number of mismatches."""
    common = {"model": SEQUENCE_MODEL, "seq_len": 32, "micro_batch": 2, "grad_accum": accum, "steps": 3, "hf": True}
    cases = [{**common, "strategy": strategy, **options} for strategy, options in HF_CASES.values()]
    ranks = spawn(world, "cases", {"worker": "train_llama", "cases": cases})
    failures = 0
    for i, (label, (strategy, options)) in enumerate(HF_CASES.items()):
        s = validation_scenario(strategy, SEQUENCE_MODEL, world, seq_len=32, micro_batch=2, grad_accum=accum,
                                reshard_root=options.get("reshard_root"))
        same = all(recorded(r["cases"][i]["log"], 2) == planned(s) for r in ranks)
        plan = planned_state(s)
        memory = {k: max(r["cases"][i]["state"][k] for r in ranks) for k in plan} == plan
        failures += (not same) + (not memory)
        print(f"{label:26s}{world:6d}{accum:6d}  {'match' if same else 'DIFFER':8s}  "
              f"{'match' if memory else 'DIFFER'}", file=out)
    return failures


def _calibrate_device(args: argparse.Namespace, out: TextIO) -> int:
    """One device: GEMM efficiency by shape, H2D / D2H bandwidth, CPU Adam, and with --check the device
    check (docs/validation.md)."""
    import json

    from sim.validate.measure import measure_device
    h, f = 8192, 28672   # Llama-2-70B-like GEMMs at 4K tokens, and a small one
    shapes = [(4096, h, h), (4096, h, f), (4096, f, h), (4096, h, 1024), (512, 1024, 1024)]
    peak = args.peak_TFLOPS * 1e12 if args.peak_TFLOPS else None
    # with --check, no DeepSpeedCPUAdam: its just-in-time C++ build takes a minute of a lent GPU's few
    result = measure_device(args.device, shapes, peak, deepspeed_adam=not args.check)
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"device-{args.device.replace(':', '')}.json").write_text(json.dumps(result, indent=2))
    for row in result["gemm"]:
        eff = f"{100 * row['efficiency']:.1f}%" if row["efficiency"] else "-"
        print(f"GEMM {row['shape']}: {row['flops'] / 1e12:.2f} TFLOP/s, efficiency {eff}", file=out)
    for name, rate in result["copies"].items():
        print(f"{name}: {rate / 1e9:.1f} GB/s", file=out)
    for name, rate in result["adam"].items():
        print(f"{name}: {rate if isinstance(rate, str) else f'{rate / 1e9:.2f} G params/s'}", file=out)
    if args.check:
        _device_check(args, folder, out)
    return 0


def _device_check(args: argparse.Namespace, folder: Path, out: TextIO) -> None:
    """The issue's device check (sim.validate.device_check), its JSON, and a summary."""
    import json

    from sim.validate.device_check import device_check, summary_lines
    path = folder / f"device-check-{args.device.replace(':', '')}.json"

    def save(partial: dict[str, Any]) -> None:
        path.write_text(json.dumps(partial, indent=2))
    result = device_check(args.device, quick=args.device == "cpu", sustain_s=args.sustain_s,
                          log=lambda what: print(f"check: {what}", file=out, flush=True),
                          save=save)
    for line in summary_lines(result):
        print(line, file=out)
    print(f"device check: {path} ({result['seconds']:.0f} s)", file=out)
