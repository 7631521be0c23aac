"""`zerosim calibrate` and `zerosim validate` (torch is imported here, not by `sim.cli`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from sim.validate.calibrate import SIZES, calibrate
from sim.validate.compare import planned, planned_state, recorded, validation_scenario
from sim.validate.timing import STRATEGIES, TIMING_MODEL, TIMING_RUN, predicted_vs_measured, profile_for
from sim.validate.torch_runs import spawn

SEQUENCE_MODEL = {"layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2, "ffn_hidden": 384, "vocab": 2048}
DEFAULT_PROFILE_DIR = Path.home() / ".cache" / "zerosim" / "calibrated"


def cmd_calibrate(args: argparse.Namespace) -> int:
    if args.device:
        return _calibrate_device(args)
    sizes = tuple(s for s in SIZES if s <= args.max_size_MiB * 2**20)
    tokens = TIMING_RUN["seq_len"] * TIMING_RUN["micro_batch"]
    results = calibrate(Path(args.out), worlds=tuple(args.worlds), sizes=sizes, model=TIMING_MODEL, tokens=tokens)
    for world, r in sorted(results.items()):
        c = r["compute"]
        print(f"{world} processes: GEMM {c['gemm_flops'] / 1e9:.1f} GFLOP/s, memory {c['memory_bandwidth'] / 1e9:.2f} "
              f"GB/s, kernel overhead {c['kernel_overhead'] * 1e6:.1f} us -> {r['path']}")
        for op, (alpha, busbw) in sorted(r["fits"].items()):
            print(f"  {op:15s} alpha {alpha * 1e6:9.1f} us/step   busbw {busbw / 1e9:8.3f} GB/s")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    failures = 0
    print(f"{'strategy':22s}{'world':>6s}{'accum':>6s}  sequence  memory")
    try:
        import deepspeed  # noqa: F401
        deepspeed_runs = [f"deepspeed-zero{k}" for k in range(4)]
    except ImportError:
        deepspeed_runs = []
        print("(deepspeed is not installed: its runs are skipped)")
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
            print(f"{strategy:22s}{world:6d}{accum:6d}  {'match' if same else 'DIFFER':8s}  {'match' if memory else 'DIFFER'}")
    if args.profile_dir:
        print(f"\n{'strategy':22s}{'world':>6s}{'measured s':>12s}{'predicted s':>13s}{'error':>8s}")
        for world in args.worlds:
            for row in predicted_vs_measured(profile_for(Path(args.profile_dir), world), world):
                print(f"{row['strategy']:22s}{world:6d}{row['measured_s']:12.4f}{row['predicted_s']:13.4f}"
                      f"{100 * row['error']:7.1f}%")
    return 1 if failures else 0


def _calibrate_device(args: argparse.Namespace) -> int:
    """One device: GEMM efficiency by shape, H2D / D2H bandwidth, CPU Adam (docs/validation.md)."""
    import json

    from sim.validate.calibrate import measure_device
    h, f = 8192, 28672   # Llama-2-70B-like GEMMs at 4K tokens, and a small one
    shapes = [(4096, h, h), (4096, h, f), (4096, f, h), (4096, h, 1024), (512, 1024, 1024)]
    peak = args.peak_TFLOPS * 1e12 if args.peak_TFLOPS else None
    result = measure_device(args.device, shapes, peak)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"device-{args.device.replace(':', '')}.json").write_text(json.dumps(result, indent=2))
    for row in result["gemm"]:
        eff = f"{100 * row['efficiency']:.1f}%" if row["efficiency"] else "-"
        print(f"GEMM {row['shape']}: {row['flops'] / 1e12:.2f} TFLOP/s, efficiency {eff}")
    for name, rate in result["copies"].items():
        print(f"{name}: {rate / 1e9:.1f} GB/s")
    for name, rate in result["adam"].items():
        print(f"{name}: {rate if isinstance(rate, str) else f'{rate / 1e9:.2f} G params/s'}")
    return 0
