"""Measurements one process makes: gloo collectives and sustained compute (run on every rank
of a `spawn`ed process group by `zerosim calibrate`), and one device (GEMM efficiency by
shape, host-device copies, CPU Adam: `zerosim calibrate --device`)."""

from __future__ import annotations

import importlib.util
import statistics
import time
import warnings
from typing import Any

import torch
import torch.distributed as dist

from sim.validate.measure_memory import memory_kernel_totals

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
SIZES = tuple(2**10 * 4**i for i in range(9))          # 1 KiB ... 64 MiB


def _quiet() -> None:
    """torch 2.13 calls all_gather_into_tensor / reduce_scatter_tensor deprecated; we measure them anyway."""
    warnings.filterwarnings("ignore", category=FutureWarning)


def timed_median(fn: Any, reps: int, after: Any = None, warmup: int = 2) -> float:
    """Median seconds of fn() over `reps` calls after `warmup` untimed ones, every process
    starting each call together; `after` runs untimed after each call (DeepSpeed's step)."""
    times = []
    for i in range(warmup + reps):
        dist.barrier()
        start = time.perf_counter()
        fn()
        if i >= warmup:
            times.append(time.perf_counter() - start)
        if after is not None:
            after()
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
            out[(op, size)] = timed_median(calls[op], reps)
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


def gemm_rate(shapes: list[list[int]] | list[tuple[int, int, int]], windows: int = 5, seconds: float = 0.25) -> float:
    """FLOP/s of the (m, k, n) GEMMs run back to back by every process at once: the median
    of `windows` sustained windows, each begun together (a barrier). One window would take
    whatever the machine's speed was in that fraction of a second; this 2-vCPU machine's
    GEMM rate moves by 15-30% from one second to the next (sim.validate.timing)."""
    gemms = [(torch.randn(t, i), torch.randn(i, o)) for t, i, o in shapes]
    flops = sum(_gemm_flops(a, b) for a, b in gemms)
    return statistics.median(_sustained(lambda: [a @ b for a, b in gemms], flops, seconds) for _ in range(windows))


def measure_compute(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """GEMM FLOP/s on the given (m, k, n) shapes, DRAM bytes/s (a 64 MiB add), the bytes/s
    of elementwise kernels on the model's activation sizes (`activation_elements`), the
    cost of a tiny kernel and the slowdown of compute beside a collective, with every
    process busy at once (so the numbers include the contention of the real runs). The
    GEMM rate is `gemm_rate`'s median of windows, the one timing runs re-measure.

    The elementwise rate is a bare multiply's (eager PyTorch writes a fresh output per op);
    with `memory_kernels` (sim.validate.measure_memory.memory_kernel_totals' arguments) the
    model's own memory-bound kernels and Adam step are timed too, for the fraction of that
    rate they reach; the 64 MiB add measures DRAM streaming, the host's own rate."""
    gemms = [(torch.randn(t, i), torch.randn(i, o)) for t, i, o in cfg["gemm_shapes"]]
    rate = gemm_rate(cfg["gemm_shapes"])
    x, y = torch.randn(2**22), torch.randn(2**22)
    memory = _sustained(lambda: torch.add(x, y), 3 * 4 * 2**22)
    pairs = [(torch.randn(n), torch.randn(n)) for n in cfg["activation_elements"]]
    moved = sum(3 * 4 * a.numel() for a, _ in pairs)
    elementwise = _sustained(lambda: [torch.mul(a, b) for a, b in pairs], moved)
    tiny = torch.randn(8, 8)
    overhead = 1.0 / _sustained(lambda: tiny @ tiny, 1.0, 0.2)
    kernels = cfg.get("memory_kernels")
    memory_kernels = memory_kernel_totals(**kernels, timer=lambda fn: 1.0 / _sustained(fn, 1.0, 0.3)) \
        if kernels else None
    return {"gemm_flops": rate, "memory_bandwidth": memory, "elementwise_bandwidth": elementwise,
            "memory_kernels": memory_kernels, "kernel_overhead": overhead, "comm_interference": _interference(*gemms[0]),
            "rank_piece": rank_piece_seconds(),
            "attention": attention_seconds(*_heads_seq_dim(cfg["attention"])) if cfg.get("attention") else None}


def _heads_seq_dim(shape: list[int]) -> tuple[int, int, int]:
    """(batch x heads, seq, head_dim) of calibrate's (batch x heads, kv heads, seq, head_dim):
    transformers' sdpa path repeats the key/value heads, so the kernel sees every head."""
    batch_heads, _, seq, head_dim = shape
    return batch_heads, seq, head_dim


def attention_seconds(batch_heads: int, seq: int, head_dim: int) -> tuple[float, float]:
    """Seconds of one causal scaled_dot_product_attention forward and of its backward on
    (batch_heads, seq, head_dim) fp32 tensors, every process at once (the transformers
    sdpa path the timing runs take)."""
    q, k, v = (torch.randn(1, batch_heads, seq, head_dim, requires_grad=True) for _ in range(3))
    grad = torch.randn(1, batch_heads, seq, head_dim)
    forward = 1.0 / _sustained(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
                               1.0, 0.3)

    def both() -> None:
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)
    return forward, max(1.0 / _sustained(both, 1.0, 0.3) - forward, 0.0)


def rank_piece_seconds(ranks: int = 1024, piece: int = 8) -> float:
    """Host seconds per (rank, tensor) piece of DeepSpeed ZeRO-3's Python slicing
    (HostSpec.zero3_rank_piece): what `AllGatherCoalescedHandle.wait` does per gathered
    tensor, a loop over the ranks that narrows the flat buffer and appends each slice,
    then one torch.cat of the slices; on tiny slices, so the copy costs next to nothing."""
    flat = torch.zeros(ranks * piece)

    def unpack() -> torch.Tensor:
        parts = []
        for r in range(ranks):
            parts.append(flat.narrow(0, r * piece, piece))
        return torch.cat(parts)
    return 1.0 / _sustained(unpack, float(ranks), 0.2)


def _gemm_flops(a: torch.Tensor, b: torch.Tensor) -> float:
    return 2.0 * a.shape[0] * a.shape[1] * b.shape[1]


MAX_INTERFERENCE = 9.0     # compute at a tenth of its rate beside a collective


def _interference(a: torch.Tensor, b: torch.Tensor, nbytes: int = 2**26) -> float:
    """How much a collective in flight slows compute (GpuSpec.comm_interference c: beside a
    collective, compute runs at 1 / (1 + c) of its rate, sim.des.interference), from the
    GEMM rate while a 64 MiB all-reduce runs asynchronously: c = rate_alone / rate_beside - 1,
    median of three, at most 9 (a tenth of the rate). Where gloo's threads share the cores
    with compute, as with 2-4 processes on 2 cores, the collective's copies and reductions
    take the cores' time. (Until 2026-12-04 this returned 1 - rate_beside / rate_alone,
    which is c / (1 + c): 0.3 where c is 0.43.)"""
    flops = _gemm_flops(a, b)
    alone = _sustained(lambda: a @ b, flops, 0.3)
    buf = torch.ones(nbytes // 4)
    rates = []
    for _ in range(3):
        dist.barrier()
        work = dist.all_reduce(buf, async_op=True)
        done, start = 0, time.perf_counter()
        while not work.is_completed():
            _ = a @ b
            done += 1
        elapsed = time.perf_counter() - start
        work.wait()
        rates.append(done * flops / elapsed if done else 0.0)
    beside = statistics.median(rates)
    return min(MAX_INTERFERENCE, max(0.0, alone / beside - 1.0)) if beside > 0 else MAX_INTERFERENCE


def synchronizer(device: str) -> Any:
    """What waits for `device`'s queued work: CUDA's synchronize, nothing on a CPU."""
    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


def training_dtype(device: str) -> torch.dtype:
    """The dtype GEMMs are measured in: bf16 on a GPU, fp32 on a CPU."""
    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def synced_median(fn: Any, device: str, reps: int = 10, warmup: int = 3) -> float:
    """Median seconds of fn() on `device` over `reps` calls after `warmup`, synchronising a
    CUDA device around each call."""
    sync = synchronizer(device)
    for _ in range(warmup):
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
    dtype = training_dtype(device)
    gemm = []
    for tokens, inp, out in shapes:
        a = torch.randn(tokens, inp, device=device, dtype=dtype)
        b = torch.randn(inp, out, device=device, dtype=dtype)
        rate = 2.0 * tokens * inp * out / synced_median(lambda: a @ b, device)
        gemm.append({"shape": [tokens, inp, out], "flops": rate,
                     "efficiency": rate / peak_flops if peak_flops else None})
    copies = {}
    if device.startswith("cuda"):
        n = 2**26
        gpu = torch.empty(n, device=device)
        for pinned in (True, False):
            host = torch.empty(n, pin_memory=pinned)
            name = "pinned" if pinned else "pageable"
            copies[f"h2d_{name}"] = 4 * n / synced_median(lambda: gpu.copy_(host, non_blocking=pinned), device)
            copies[f"d2h_{name}"] = 4 * n / synced_median(lambda: host.copy_(gpu, non_blocking=pinned), device)
    adam: dict[str, Any] = {}
    params = torch.nn.Parameter(torch.randn(adam_params))
    params.grad = torch.randn(adam_params)
    torch_adam = torch.optim.Adam([params], lr=1e-3)
    adam["torch_adam_params_per_s"] = adam_params / synced_median(torch_adam.step, "cpu", 5)
    if not deepspeed_adam:
        adam["deepspeed_cpu_adam"] = "not measured: not asked for"
        return {"device": device, "gemm": gemm, "copies": copies, "adam": adam}
    if importlib.util.find_spec("deepspeed") is not None:
        from sim.validate.build_locks import check_build_locks
        check_build_locks()
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        ds_adam = DeepSpeedCPUAdam([params], lr=1e-3)
        adam["deepspeed_cpu_adam_params_per_s"] = adam_params / synced_median(ds_adam.step, "cpu", 5)
    except Exception as error:  # not installed, or its C++ extension cannot build here
        adam["deepspeed_cpu_adam"] = f"not measured: {type(error).__name__}"
    return {"device": device, "gemm": gemm, "copies": copies, "adam": adam}
