"""`zerosim calibrate`: measure this machine and write a hardware profile for it.

Measured with `world` gloo processes at once (as the validation runs use the machine):
the four collectives at sizes 1 KiB to 64 MiB on 2 and 4 ranks, fitted per op by least
squares to t = alpha x steps(op, n) + S x factor(op, n) / busbw (NCCL's step counts and
nccl-tests' bus factors, sim.analytic.opcost), GEMM throughput on the model's layer
shapes, memory bandwidth (a large add), and the per-op overhead of small kernels. The
profile is a cluster TOML plus a GPU TOML, written outside the repository by default
(~/.cache/zerosim/calibrated), each number with its provenance.

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
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from sim.analytic.opcost import bus_factor, ring_steps
from sim.schedule import Coll

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
SIZES = tuple(2**10 * 4**i for i in range(9))          # 1 KiB ... 64 MiB


def _quiet() -> None:
    """torch 2.13 calls all_gather_into_tensor / reduce_scatter_tensor deprecated; we measure them anyway."""
    warnings.filterwarnings("ignore", category=FutureWarning)


def _timed(fn: Any, reps: int) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        dist.barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_collectives(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """Median seconds per (op, size) on this many ranks."""
    _quiet()
    out = {}
    for size in cfg.get("sizes", SIZES):
        n = size // 4
        reps = cfg.get("reps", 5) if size <= 2**22 else 3
        buf, shard = torch.ones(n), torch.ones(max(1, n // world))
        gathered = torch.empty(shard.numel() * world)
        calls = {"all_reduce": lambda: dist.all_reduce(buf),
                 "all_gather": lambda: dist.all_gather_into_tensor(gathered, shard),
                 "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, gathered),
                 "broadcast": lambda: dist.broadcast(buf, src=0)}
        for op in OPS:
            out[(op, size)] = _timed(calls[op], reps)
    return {"times": out}


def _sustained(fn: Any, work: float, seconds: float = 0.6) -> float:
    """Work per second while every process runs `fn` back to back (CPU contention included)."""
    fn()
    dist.barrier()
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        done += 1
    return done * work / (time.perf_counter() - start)


def measure_compute(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """GEMM FLOP/s on the given shapes, memory bytes/s, and the cost of a tiny kernel, with
    every process busy at once (so the numbers include the contention of the real runs)."""
    gemms = [(torch.randn(t, i), torch.randn(i, o)) for t, i, o in cfg["gemm_shapes"]]
    flops = sum(2.0 * a.shape[0] * a.shape[1] * b.shape[1] for a, b in gemms)
    gemm_rate = _sustained(lambda: [a @ b for a, b in gemms], flops)
    x, y = torch.randn(2**22), torch.randn(2**22)
    memory = _sustained(lambda: torch.add(x, y), 3 * 4 * 2**22)
    tiny = torch.randn(8, 8)
    overhead = 1.0 / _sustained(lambda: tiny @ tiny, 1.0, 0.2)
    return {"gemm_flops": gemm_rate, "memory_bandwidth": memory, "kernel_overhead": overhead}


def fit_alpha_beta(samples: list[tuple[int, int, float]], op: str,
                   max_busbw: float = math.inf) -> tuple[float, float]:
    """Least squares of t = alpha steps(op, n) + S factor(op, n) / busbw over (n, S, t);
    returns (alpha per step in s, bus bandwidth in bytes/s), both constrained: alpha >= 0
    and busbw <= `max_busbw`. When the sizes are too small for the bandwidth to show, the
    free fit's 1/busbw comes out near zero or negative; then busbw is `max_busbw` (calibrate
    passes the measured memory bandwidth: a shared-memory collective cannot move data
    faster than memory does) and alpha is refitted alone."""
    coll = Coll(op)
    steps = np.array([ring_steps(coll, n) for n, _, _ in samples], dtype=float)
    moved = np.array([size * bus_factor(coll, n) for n, size, _ in samples], dtype=float)
    t = np.array([s for _, _, s in samples])
    (alpha, inv_bw), *_ = np.linalg.lstsq(np.column_stack([steps, moved]), t, rcond=None)
    if alpha < 0:    # all the time in the bytes
        alpha, inv_bw = 0.0, float(moved @ t / (moved @ moved))
    if inv_bw <= 0 or inv_bw * max_busbw < 1.0:   # faster than allowed (or negative): the bound
        inv_bw = max(1.0 / max_busbw, 1e-30)
        alpha = max(float(steps @ (t - moved * inv_bw) / (steps @ steps)), 0.0)
    return float(alpha), 1.0 / float(inv_bw)


def write_profile(out_dir: Path, fits: dict[str, tuple[float, float]], compute: dict[str, float],
                  gpus_per_node: int) -> Path:
    """Write calibrated GPU and cluster TOML files for `gpus_per_node` processes sharing the
    machine (contention differs with their number); return the cluster file's path."""
    suffix = f"-w{gpus_per_node}"
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = f"zerosim calibrate on {platform.node()} ({platform.machine()}), torch {torch.__version__}, " \
            f"{_dt.date.today().isoformat()}"
    gflops = compute["gemm_flops"] / 1e12
    (out_dir / f"cpu-process-calibrated{suffix}.toml").write_text(f"""# One gloo process of this machine, measured: {stamp}
name = "CPU-process (calibrated)"
memory_GiB = 6                      # placeholder: not measured
memory_bandwidth_GBps = {compute['memory_bandwidth'] / 1e9:.6g}  # measured: a 64 MiB add, all processes at once
bf16_TFLOPS = {gflops:.6g}   # measured fp32 GEMM throughput (CPU bf16 not measured)
fp16_TFLOPS = {gflops:.6g}   # measured fp32 GEMM throughput (CPU fp16 not measured)
fp32_TFLOPS = {gflops:.6g}   # measured: the model's GEMM shapes, all processes at once
matmul_efficiency = 1.0             # the measured rate is the achieved rate
memory_bandwidth_efficiency = 1.0   # the measured rate is the achieved rate
kernel_overhead_us = {compute['kernel_overhead'] * 1e6:.6g}   # measured: an 8x8 matmul, dispatch included
""")
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
             "", "[calibration]  # least-squares fits of the measured collectives"]
    for op, (alpha, busbw) in sorted(fits.items()):
        lines += [f"{op}_alpha_us = {alpha * 1e6:.6g}  # measured", f"{op}_busbw_GBps = {busbw / 1e9:.6g}  # measured"]
    path = out_dir / f"local-cpu-calibrated{suffix}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def gemm_shapes(model: dict[str, Any], tokens: int) -> list[tuple[int, int, int]]:
    """The (tokens, in, out) GEMMs of a llama-like model's forward."""
    h, f, v = model["hidden"], model["ffn_hidden"], model["vocab"]
    kv = h // model["heads"] * model["kv_heads"]
    return [(tokens, h, h), (tokens, h, kv), (tokens, h, f), (tokens, f, h), (tokens, h, v)]


def calibrate(out_dir: Path, *, worlds: tuple[int, ...] = (2, 4), sizes: tuple[int, ...] = SIZES,
              model: dict[str, Any], tokens: int) -> dict[int, dict[str, Any]]:
    """Measure, fit and write one profile per number of processes; return, per world, the
    profile's path and the raw numbers."""
    from sim.validate.torch_runs import spawn
    out = {}
    for world in worlds:
        times = spawn(world, "measure_collectives", {"sizes": list(sizes)})[0]["times"]
        samples: dict[str, list[tuple[int, int, float]]] = {op: [] for op in OPS}
        for (op, size), t in times.items():
            samples[op].append((world, size, t))
        compute = spawn(world, "measure_compute", {"gemm_shapes": gemm_shapes(model, tokens)})[0]
        fits = {op: fit_alpha_beta(s, op, max_busbw=compute["memory_bandwidth"]) for op, s in samples.items()}
        out[world] = {"path": write_profile(out_dir, fits, compute, world), "samples": samples,
                      "fits": fits, "compute": compute}
    return out


def _synced(fn: Any, device: str, reps: int = 10) -> float:
    """Median seconds of fn() on `device`, synchronising a CUDA device around each call."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(3):
        fn()
    sync()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_device(device: str, shapes: list[tuple[int, int, int]], peak_flops: float | None, *,
                   adam_params: int = 2**24, deepspeed_adam: bool = True) -> dict[str, Any]:
    """One process on one device: GEMM throughput (and efficiency against `peak_flops`) by
    shape, host-device copy bandwidth pinned and pageable (CUDA only), and CPU Adam
    throughput on `adam_params` fp32 parameters (torch's, and with `deepspeed_adam`
    DeepSpeedCPUAdam's when deepspeed is installed).

    DeepSpeedCPUAdam is a C++ op that DeepSpeed builds just in time on first use: about a
    minute on 2 cores the first time (then ~3 s to load); the rest takes about a second on
    the default sizes. A stale build lock (sim.validate.build_locks) would hang that build,
    so it is refused first."""
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    gemm = []
    for tokens, inp, out in shapes:
        a = torch.randn(tokens, inp, device=device, dtype=dtype)
        b = torch.randn(inp, out, device=device, dtype=dtype)
        rate = 2.0 * tokens * inp * out / _synced(lambda: a @ b, device)
        gemm.append({"shape": [tokens, inp, out], "flops": rate,
                     "efficiency": rate / peak_flops if peak_flops else None})
    copies = {}
    if device.startswith("cuda"):
        n = 2**26
        gpu = torch.empty(n, device=device)
        for pinned in (True, False):
            host = torch.empty(n, pin_memory=pinned)
            name = "pinned" if pinned else "pageable"
            copies[f"h2d_{name}"] = 4 * n / _synced(lambda: gpu.copy_(host, non_blocking=pinned), device)
            copies[f"d2h_{name}"] = 4 * n / _synced(lambda: host.copy_(gpu, non_blocking=pinned), device)
    adam: dict[str, Any] = {}
    params = torch.nn.Parameter(torch.randn(adam_params))
    params.grad = torch.randn(adam_params)
    torch_adam = torch.optim.Adam([params], lr=1e-3)
    adam["torch_adam_params_per_s"] = adam_params / _synced(torch_adam.step, "cpu", 5)
    if not deepspeed_adam:
        adam["deepspeed_cpu_adam"] = "not measured: not asked for"
        return {"device": device, "gemm": gemm, "copies": copies, "adam": adam}
    if importlib.util.find_spec("deepspeed") is not None:
        from sim.validate.build_locks import check_build_locks
        check_build_locks()
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        ds_adam = DeepSpeedCPUAdam([params], lr=1e-3)
        adam["deepspeed_cpu_adam_params_per_s"] = adam_params / _synced(ds_adam.step, "cpu", 5)
    except Exception as error:  # not installed, or its C++ extension cannot build here
        adam["deepspeed_cpu_adam"] = f"not measured: {type(error).__name__}"
    return {"device": device, "gemm": gemm, "copies": copies, "adam": adam}
