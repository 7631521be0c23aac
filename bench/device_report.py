"""Benchmark: a GPU's device check (`zerosim calibrate --device cuda --check`) against the
clock's model of that GPU.

Reads the check's JSON (sim.validate.device_check) and a cluster file of the catalog, and
prints, section by section, what was measured beside what the simulator takes:
- GEMMs: measured TFLOP/s per shape against sim.analytic.kernel_time on the cluster's GPU
  (sim.studies.gemm_table.compared, as bench/gemm_shapes.py does with XLA's table);
- sustained GEMM: the first and last windows and the lowest, with the SM clocks read;
- attention: seconds per backend and sequence length against the flash kernels of
  sim.analytic.kernels.attention on that GPU;
- memory-bound kernels: rate over the GPU file's HBM bandwidth, against its
  `memory_bandwidth_efficiency`;
- launches: the eager per-kernel time against the host's `launch_us`, the CUDA-graph gap
  against the GPU's `kernel_overhead_us`;
- steps: the measured small-Llama steps (plain, FSDP2, ZeRO-3) against `zerosim run` of
  the same model on one GPU of the cluster, and for a wrapped step its extra time over the
  plain one per hook call the planner counts (`Op.hooks`): on the host-bound run, an upper
  bound on `fsdp2_hook_us` / `zero3_hook_us` (it also holds the framework's extra kernels,
  copies and collectives, which measure_hooks subtracts on the CPU runs). The plain step is simulated as DDP on one GPU
  (no gradient traffic); the check trains bf16 parameters with torch's Adam (FSDP2 and
  plain) and DeepSpeed's bf16 optimizer (fp32 master weights), the simulator mixed
  precision throughout, so the optimizer's share differs a little.

Nothing here is fitted: the figures are for docs/validation.md and for a person deciding
which hardware values the measurement replaces (with the date and device as the source).

Run: python bench/device_report.py DIR/device-check-cuda.json [--cluster dgx-h100]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import pandas as pd

from sim.analytic.kernel_time import kernel_time
from sim.analytic.kernels import attention
from sim.core.enums import AttentionImpl, KernelStyle
from sim.inputs.catalog import catalog_dir
from sim.inputs.hardware import load_cluster
from sim.inputs.load import scenario_from_table
from sim.simulate import simulate
from sim.studies.gemm_table import compared

ENGINES = {"plain_s": "ddp", "fsdp2_s": "fsdp2", "deepspeed_zero3_s": "deepspeed"}


def gemm_table(check: dict[str, Any], gpu: Any) -> pd.DataFrame:
    """The check's GEMMs with the kernel model's prediction (error = predicted / measured - 1)."""
    rows = [{"label": r["label"], "m": r["shape"][0], "k": r["shape"][1], "n": r["shape"][2], "b": 1,
             "tflops": r["flops"] / 1e12} for r in check["gemm"]]
    return compared(gpu, pd.DataFrame(rows))


def attention_table(check: dict[str, Any], gpu: Any, precision: str = "bf16") -> pd.DataFrame:
    """Measured attention seconds beside the model's flash kernels on the same shape."""
    rows = []
    for r in check.get("attention", []):
        if "error" in r or r["backward_s"] <= 0:
            continue
        passes = attention("attention", r["batch"] * r["heads"], r["batch"] * r["heads"], r["seq"], r["head_dim"],
                           AttentionImpl.FLASH, KernelStyle.TORCH, False, 2)
        forward = kernel_time(passes.forward[0], gpu, precision)
        backward = kernel_time(passes.backward_input[0], gpu, precision)
        rows.append({"backend": r["backend"], "seq": r["seq"], "forward_ms": 1e3 * r["forward_s"],
                     "model_forward_ms": 1e3 * forward, "forward_error": forward / r["forward_s"] - 1,
                     "backward_ms": 1e3 * r["backward_s"], "model_backward_ms": 1e3 * backward,
                     "backward_error": backward / r["backward_s"] - 1,
                     "forward_of_peak": r["forward_flops"] / gpu.peak_flops(precision),
                     "backward_of_peak": r["backward_flops"] / gpu.peak_flops(precision)})
    return pd.DataFrame(rows)


def step_table(check: dict[str, Any], cluster: str) -> pd.DataFrame:
    """Each measured step beside `zerosim run` of the same model on one GPU of `cluster`."""
    rows = []
    for key in ("steps", "host_bound_steps"):
        steps = check.get(key)
        if not steps:
            continue
        for field, engine in ENGINES.items():
            if field not in steps:
                continue
            table: dict[str, Any] = {
                "model": steps["model"], "cluster": cluster, "nodes": 1, "gpus_per_node": 1, "engine": engine,
                "training": {"seq_len": steps["seq_len"], "micro_batch": steps["micro_batch"], "grad_accum": 1,
                             "precision": "bf16", "gradient_clipping": 0.0},
                "compute": {"kernels": "hf"}}
            if engine == "deepspeed":
                table["zero"] = {"stage": 3}
            result = simulate(scenario_from_table(table, Path("bench/device_report.py"), f"{key}-{engine}"))
            hooks = sum(op.hooks for cls in result.schedule.classes for op in cls.ops())
            extra = steps[field] - steps["plain_s"]
            rows.append({"run": key, "engine": engine, "measured_ms": 1e3 * steps[field],
                         "predicted_ms": 1e3 * result.step_time_s,
                         "error": result.step_time_s / steps[field] - 1,
                         "exposed_host_ms": 1e3 * result.breakdown.exposed_host_s, "hook_calls": hooks,
                         "us_per_hook_at_most": 1e6 * extra / hooks if hooks else None})
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("check", type=Path, help="device-check-cuda.json from zerosim calibrate --device cuda --check")
    ap.add_argument("--cluster", default="dgx-h100", help="catalog cluster whose GPU and host to compare with")
    args = ap.parse_args()
    check = json.loads(args.check.read_text())
    cluster = load_cluster(catalog_dir("hardware") / f"{args.cluster}.toml")
    gpu, host = cluster.gpu, cluster.host
    print(f"device check of {check['name']} ({check['device']}, torch {check['torch']}), {check['date_utc']} UTC, "
          f"against {args.cluster} ({gpu.name})")
    pd.options.display.width = 160
    for key, error in check.get("errors", {}).items():
        print(f"section {key} failed on the device: {error}")
    if check.get("gemm"):
        g = gemm_table(check, gpu)
        print(f"\nGEMMs: median |error| {100 * g['error'].abs().median():.1f}% (predicted / measured - 1)\n"
              f"{g[['label', 'm', 'k', 'n', 'tflops', 'predicted', 'error']].to_string()}")
    rates = [w["flops"] for w in check.get("sustained", [])]
    if rates:
        clocks = [w["sm_clock_MHz"] for w in check["sustained"] if "sm_clock_MHz" in w]
        median = statistics.median(rates)
        print(f"\nsustained GEMM, {len(rates)} windows: first {rates[0] / 1e12:.0f}, last {rates[-1] / 1e12:.0f}, "
              f"lowest {min(rates) / 1e12:.0f}, median {median / 1e12:.0f} TFLOP/s ({median / gpu.peak_flops('bf16'):.3f} "
              f"of peak; matmul_efficiency {gpu.matmul_efficiency:.3f})"
              + (f"; SM clock {min(clocks):.0f}-{max(clocks):.0f} MHz" if clocks else ""))
    a = attention_table(check, gpu)
    if len(a):
        print(f"\nattention (flash kernels of the model; attention_efficiency {gpu.attention_efficiency:.3f}, "
              f"backward {gpu.attention_backward_efficiency:.3f}):\n{a.to_string(float_format='{:.3f}'.format)}")
    spec = gpu.memory_bandwidth
    if "memory" in check:
        print("\nmemory-bound: " + ", ".join(f"{k[:-4]} {v / spec:.3f}" for k, v in check["memory"].items())
              + f" of {spec / 1e9:.0f} GB/s (memory_bandwidth_efficiency {gpu.memory_bandwidth_efficiency:.3f})")
    if "launch" in check:
        launch = check["launch"]
        print(f"per tiny kernel: eager {1e6 * launch['eager_s']:.2f} us (launch_us {1e6 * host.launch:.2f})"
              + (f", graph {1e6 * launch['graph_s']:.2f} us (kernel_overhead_us {1e6 * gpu.kernel_overhead:.2f})"
                 if "graph_s" in launch else ""))
    s = step_table(check, args.cluster)
    if len(s):
        print(f"\nsteps (zerosim run on one GPU of {args.cluster}; its fsdp2_hook_us {1e6 * host.fsdp2_hook:.0f}, "
              f"zero3_hook_us {1e6 * host.zero3_hook:.0f}):\n{s.to_string(float_format='{:.3f}'.format)}")


if __name__ == "__main__":
    main()
