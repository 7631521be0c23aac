"""`zerosim calibrate`: measure this machine and write a hardware profile for it.

Measured with `world` gloo processes at once (as the validation runs use the machine):
the four collectives at sizes 1 KiB to 64 MiB on 2 and 4 ranks, fitted per op by least
squares of the relative error to t = alpha x steps(op, n) + S x factor(op, n) / busbw
(NCCL's step counts and nccl-tests' bus factors, sim.analytic.opcost; the profile keeps the
measured curve, `<op>_busbw_curve`, which the simulator interpolates, and the line beside
it as a comment), GEMM throughput on the model's layer shapes, memory bandwidth (a large
add), and the per-op overhead of small kernels. The profile is a cluster TOML plus a GPU
TOML, written outside the repository by default (~/.cache/zerosim/calibrated), each number
with its provenance.

On a GPU machine the same command measures the GPU: GEMM efficiency by shape, HBM
bandwidth and kernel overhead (docs/validation.md says how; interconnect calibration there
uses nccl-tests).
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
import math
import platform
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sim.analytic import kernels as kn
from sim.analytic.kernel_time import causal_share
from sim.analytic.opcost import bus_factor, ring_steps
from sim.core.enums import AttentionImpl, Coll, KernelStyle
from sim.core.model import module_tree
from sim.inputs.models import model_from_table
from sim.validate.measure import OPS, SIZES
from sim.validate.measure_memory import memory_efficiency
from sim.validate.torch_runs import spawn


def fit_alpha_beta(samples: list[tuple[int, int, float]], op: str,
                   max_busbw: float = math.inf) -> tuple[float, float]:
    """Least squares of the relative error of t = alpha steps(op, n) + S factor(op, n) / busbw
    over (n, S, t): every row divided by its measured t, so a 1 KiB collective weighs as much
    as a 64 MiB one. An unweighted fit is decided by the largest sizes (a 64 MiB all-gather
    on 4 gloo ranks takes 125 ms, a 1 KiB one 1-4 ms) and put the 4-rank all-gather's alpha
    at 34 us, 10 to 30 times below every measured size up to 64 KiB, the sizes of the
    per-tensor gathers ZeRO-3 issues for its persistent parameters. Returns (alpha per step
    in s, bus bandwidth in bytes/s), both constrained: alpha >= 0 and busbw <= `max_busbw`.
    When the sizes are too small for the bandwidth to show, the free fit's 1/busbw comes out
    near zero or negative; then busbw is `max_busbw` (calibrate passes the measured memory
    bandwidth: a shared-memory collective cannot move data faster than memory does) and
    alpha is refitted alone."""
    coll = Coll(op)
    t = np.array([s for _, _, s in samples])
    steps = np.array([ring_steps(coll, n) for n, _, _ in samples], dtype=float) / t
    moved = np.array([size * bus_factor(coll, n) for n, size, _ in samples], dtype=float) / t
    ones = np.ones_like(t)
    (alpha, inv_bw), *_ = np.linalg.lstsq(np.column_stack([steps, moved]), ones, rcond=None)
    if alpha < 0:    # all the time in the bytes
        alpha, inv_bw = 0.0, float(moved @ ones / (moved @ moved))
    if inv_bw <= 0 or inv_bw * max_busbw < 1.0:   # faster than allowed (or negative): the bound
        inv_bw = max(1.0 / max_busbw, 1e-30)
        alpha = max(float(steps @ (ones - moved * inv_bw) / (steps @ steps)), 0.0)
    return float(alpha), 1.0 / float(inv_bw)


def measured_curve(samples: list[tuple[int, int, float]], op: str) -> list[tuple[int, float]]:
    """(size, nccl-tests bus bandwidth S x factor(op, n) / t) per measured (n, S, t), by size."""
    return sorted((size, size * bus_factor(Coll(op), n) / t) for n, size, t in samples)


def attention_efficiencies(compute: dict[str, Any], shape: tuple[int, int, int, int]) -> tuple[float, float]:
    """`attention_efficiency` and `attention_backward_efficiency` that make the simulator's
    flash-attention kernels (sim.analytic.kernels.attention, timed by
    sim.analytic.kernel_time) take the measured seconds on `shape` (batch x heads, kv heads,
    seq, head_dim): the kernel's FLOPs over the measured time less the per-kernel overhead,
    over the measured GEMM rate and the causal tile share."""
    bh, kvh, seq, d = shape
    passes = kn.attention("attention", bh, kvh, seq, d, AttentionImpl.FLASH, KernelStyle.HF, False, 4)
    out = []
    for kernel, seconds in ((passes.forward[0], compute["attention"][0]),
                            (passes.backward_input[0], compute["attention"][1])):
        busy = max(seconds - compute["kernel_overhead"], 1e-12)
        out.append(min(1.0, kernel.flops / busy / compute["gemm_flops"] / causal_share(seq)))
    return out[0], out[1]


def write_profile(out_dir: Path, fits: dict[str, tuple[float, float]], compute: dict[str, float],
                  gpus_per_node: int, hooks: dict[str, float] | None = None,
                  attention: tuple[float, float] | None = None, *,
                  curves: dict[str, list[tuple[int, float]]]) -> Path:
    """Write calibrated GPU and cluster TOML files for `gpus_per_node` processes sharing the
    machine (contention differs with their number); return the cluster file's path.
    `curves`: per op, (size in bytes, bus bandwidth in B/s) as measured (`busbw_curve`), the
    collectives' rates in the profile; `fits` go beside them as comments.
    `hooks`: measured seconds per hook call, by engine ('fsdp2', 'deepspeed'); the host is
    synchronous (a CPU process issues and runs its own work), its launch costs are in the
    measured kernel overhead and collective curves."""
    hooks = hooks or {}
    suffix = f"-w{gpus_per_node}"
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = f"zerosim calibrate on {platform.node()} ({platform.machine()}), torch {torch.__version__}, " \
            f"{_dt.date.today().isoformat()}"
    gflops = compute["gemm_flops"] / 1e12
    (out_dir / f"cpu-process-calibrated{suffix}.toml").write_text(f"""# One gloo process of this machine, measured: {stamp}
name = "CPU-process (calibrated)"
memory_GiB = 6                      # placeholder: not measured
memory_bandwidth_GBps = {compute['elementwise_bandwidth'] / 1e9:.6g}  # measured: elementwise multiplies on the model's activation sizes, all processes at once
bf16_TFLOPS = {gflops:.6g}   # measured fp32 GEMM throughput (CPU bf16 not measured)
fp16_TFLOPS = {gflops:.6g}   # measured fp32 GEMM throughput (CPU fp16 not measured)
fp32_TFLOPS = {gflops:.6g}   # measured: the model's GEMM shapes, all processes at once
matmul_efficiency = 1.0             # the measured rate is the achieved rate
memory_bandwidth_efficiency = {compute.get('memory_efficiency', 1.0):.4g}   # {_memory_note(compute)}
kernel_overhead_us = {compute['kernel_overhead'] * 1e6:.6g}   # measured: an 8x8 matmul, dispatch included
comm_interference = {compute['comm_interference']:.4g}   # measured: GEMM rate beside an async 64 MiB all-reduce
""" + ("" if attention is None else f"""attention_efficiency = {attention[0]:.4g}   # measured: causal sdpa forward on the model's shape
attention_backward_efficiency = {attention[1]:.4g}   # measured: its backward
"""))
    lines = [f"# This machine as a cluster of gloo processes, measured: {stamp}",
             f'name = "local-cpu (calibrated, {gpus_per_node} processes)"',
             f'gpu = "cpu-process-calibrated{suffix}.toml"',
             f"gpus_per_node = {gpus_per_node}  # processes per machine in the calibration",
             "", "[intra_node]", 'topology = "shared-memory"',
             "bandwidth_GBps = 1.0  # unused: the [calibration] table gives each collective's rate",
             "efficiency = 1.0      # unused", "latency_us = 50       # unused",
             "", "[inter_node]", "nics_per_node = 1       # one machine", "nic_bandwidth_Gbps = 10  # unused",
             "efficiency = 1.0        # unused", "latency_us = 50          # unused",
             "", "[host]", 'cpu = "this machine"', "cores = 2                 # as the development machine",
             "dram_GiB = 24             # as the development machine",
             f"dram_bandwidth_GBps = {compute['memory_bandwidth'] / 1e9:.6g}  # measured",
             f"pcie_bandwidth_GBps = {compute['memory_bandwidth'] / 1e9:.6g}  # host and 'device' share DRAM",
             "pcie_efficiency = 1.0  # measured rate", "pcie_latency_us = 1  # placeholder",
             f"gpus_per_pcie_switch = {gpus_per_node}  # all processes share the memory system",
             "cpu_adam_params_per_s = 2.0e8  # placeholder: not measured",
             "synchronous = true       # a CPU process runs the work it issues: host costs are inline",
             "launch_us = 0            # dispatch is in the GPU file's measured kernel_overhead_us",
             "collective_launch_us = 0  # the call is in the measured [calibration] curves",
             f"zero3_rank_piece_us = {compute['rank_piece'] * 1e6:.6g}  # measured: sim.validate.measure.rank_piece_seconds"]
    for engine, key in (("fsdp2", "fsdp2_hook_us"), ("deepspeed", "zero3_hook_us")):
        if engine in hooks:
            lines.append(f"{key} = {hooks[engine] * 1e6:.6g}  # measured: sim.validate.measure_hooks, all processes at once")
    lines += ["", "[calibration]  # the measured collectives, as nccl-tests prints them: [[size_bytes, busbw_GBps], ...]"]
    for op, (alpha, busbw) in sorted(fits.items()):
        points = ", ".join(f"[{size}, {bw / 1e9:.6g}]" for size, bw in curves[op])
        lines += [f"# {op}: relative least-squares line alpha {alpha * 1e6:.4g} us per step, "
                  f"busbw {busbw / 1e9:.4g} GB/s (for reference; the curve is used)",
                  f"{op}_busbw_curve = [{points}]  # measured"]
    path = out_dir / f"local-cpu-calibrated{suffix}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _memory_note(compute: dict[str, Any]) -> str:
    if "memory_efficiency" not in compute:
        return "the measured rate is the achieved rate"
    return ("measured: the model's memory-bound kernels and Adam step at their counted bytes "
            "(sim.validate.measure_memory)")


def memory_kernel_config(model: dict[str, Any], tokens: int, seq_len: int) -> dict[str, Any]:
    """measure_memory.memory_kernel_totals' arguments for a llama-like `model`: its
    parameter count and tensors (sim.core.model.module_tree) for the Adam step."""
    mods = module_tree(model_from_table(model, "calibration model", "model."))
    return {"model": model, "tokens": tokens, "seq": seq_len, "params": sum(m.numel for m in mods),
            "tensors": sum(len(m.tensors) for m in mods)}


def hook_engines() -> tuple[str, ...]:
    """The frameworks whose per-module hooks calibrate measures: FSDP2, and DeepSpeed's
    ZeRO-3 when deepspeed is installed."""
    return ("fsdp2", "deepspeed") if importlib.util.find_spec("deepspeed") else ("fsdp2",)


def gemm_shapes(model: dict[str, Any], tokens: int) -> list[tuple[int, int, int]]:
    """The (m, k, n) GEMMs of a llama-like model's Linears in a training step: the forward
    (tokens, in) x (in, out), the input gradient (tokens, out) x (out, in) and the weight
    gradient (in, tokens) x (tokens, out) of each."""
    h, f, v = model["hidden"], model["ffn_hidden"], model["vocab"]
    kv = h // model["heads"] * model["kv_heads"]
    out = []
    for i, o in ((h, h), (h, kv), (h, f), (f, h), (h, v)):
        out += [(tokens, i, o), (tokens, o, i), (i, tokens, o)]
    return out


def activation_elements(model: dict[str, Any], tokens: int) -> list[int]:
    """The sizes of the activations the model's elementwise kernels read and write:
    hidden-wide (norms, residual adds, rotary) and FFN-wide (the gated activation)."""
    return [tokens * model["hidden"], tokens * model["ffn_hidden"]]


def calibrate(out_dir: Path, *, worlds: tuple[int, ...] = (2, 4), sizes: tuple[int, ...] = SIZES,
              model: dict[str, Any], tokens: int, hooks: tuple[str, ...] | None = None,
              seq_len: int | None = None) -> dict[int, dict[str, Any]]:
    """Measure, fit and write one profile per number of processes; return, per world, the
    profile's path and the raw numbers. `hooks`: the engines whose hook cost to measure
    (default: hook_engines()); `seq_len`: measure the attention kernel on the model's
    shape at that length (tokens / seq_len sequences)."""
    engines = hook_engines() if hooks is None else hooks
    shape = None
    if seq_len:
        heads = model["heads"]
        shape = (tokens // seq_len * heads, model["kv_heads"], seq_len, model["hidden"] // heads)
    out = {}
    for world in worlds:
        times = spawn(world, "measure_collectives", {"sizes": list(sizes)})[0]["times"]
        samples: dict[str, list[tuple[int, int, float]]] = {op: [] for op in OPS}
        for (op, size), t in times.items():
            samples[op].append((world, size, t))
        ranks = spawn(world, "measure_compute", {"gemm_shapes": gemm_shapes(model, tokens),
                                                 "activation_elements": activation_elements(model, tokens),
                                                 "hook_engines": list(engines), "attention": shape,
                                                 "memory_kernels": memory_kernel_config(model, tokens, seq_len or tokens)})
        compute = ranks[0]
        compute["memory_efficiency"] = memory_efficiency(compute["memory_kernels"], compute["elementwise_bandwidth"],
                                                         compute["kernel_overhead"])
        hook_s = {engine: statistics.median(r["hooks"][engine] for r in ranks) for engine in engines}
        fits = {op: fit_alpha_beta(s, op, max_busbw=compute["memory_bandwidth"]) for op, s in samples.items()}
        curves = {op: measured_curve(s, op) for op, s in samples.items()}
        attention = attention_efficiencies(compute, shape) if shape else None
        path = write_profile(out_dir, fits, compute, world, hook_s, attention, curves=curves)
        out[world] = {"path": path, "samples": samples, "fits": fits, "compute": compute, "hooks": hook_s}
    return out
