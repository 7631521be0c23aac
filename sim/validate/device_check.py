"""The device check of issue 9 (`zerosim calibrate --device cuda --check`): one GPU, one
process, under five minutes, measuring what the clock's fitted GPU parameters stand for, so a
lent GPU replaces a published estimate with a measurement (docs/validation.md, "On a GPU
machine"). Every section is plain torch; DeepSpeed only where it is installed.

- `gemm_sweep`: bf16 GEMM rate by (m, k, n): the issue's two shapes (8192^3, near the best
  shape; 512 x 4096 x 4096, far below it) and the GEMMs of the published rows' models at
  their training token counts (MPT-7B / 13B of llm-foundry's table, Llama 3.1 8B of
  torchtitan's). The rates compare shape by shape with the kernel model
  (`sim.analytic.kernel_time`), as bench/gemm_shapes.py compares XLA's table.
- `sustained_gemm`: the 8192^3 GEMM back to back for tens of seconds, its rate per window
  with the SM clock, power and temperature NVML reads (nvidia-ml-py, when installed): whether
  the chip holds the rate a short benchmark shows once it reaches its power limit (the
  "clocks a GPU sustains through a training step" that docs/fidelity.md cannot tell apart).
- `attention_sweep`: causal scaled_dot_product_attention forward and backward by sequence
  length, per SDPA backend that runs (FlashAttention-2 and cuDNN on an H100; the math
  kernel on a CPU), as seconds and as FLOP/s counted as FlashAttention's benchmarks count
  them (causal: half the products); `sim.validate.calibrate.attention_efficiencies` turns
  the seconds into the simulator's `attention_efficiency`.
- `memory_bound`: HBM rate of a copy, an add and a LayerNorm (bytes read + written over
  the time): the `memory_bandwidth_efficiency` of streaming and of an eager elementwise op.
- `launch_gap`: a chain of tiny dependent kernels issued one by one (host launch + device
  gap per kernel: `launch_us`) and replayed from a CUDA graph (device gap alone:
  `kernel_overhead_us`).
- `engine_steps`: a small Llama (sim.validate.torch_models.LlamaLike, bf16) trained one
  step at a time plain, under FSDP2 (`fully_shard` per block and root) and under DeepSpeed
  ZeRO-3 (when installed), on a one-process group: the wrapped steps cost more by the
  framework's hooks and bookkeeping, on this host and this device.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from sim.validate.measure import synced_median, synchronizer, training_dtype

ISSUE_SHAPES = [(8192, 8192, 8192), (512, 4096, 4096)]
# (tokens per micro-batch, hidden, ffn) of published rows' models; each gives its block's GEMMs
MODEL_GEMMS = {"MPT-7B mb6": (6 * 2048, 4096, 16384), "MPT-13B mb2": (2 * 2048, 5120, 20480),
               "Llama-3.1-8B mb2": (2 * 8192, 4096, 14336)}
SEQUENCES = (512, 1024, 2048, 4096, 8192, 16384)
STEP_MODEL = {"layers": 8, "hidden": 1024, "heads": 16, "kv_heads": 8, "ffn_hidden": 2816, "vocab": 32000}
# many small modules, little GPU work per kernel: a host-bound step, whose wrapped steps differ
# from the plain one by the framework's host work (hooks, bookkeeping, extra launches)
HOST_STEP_MODEL = {"layers": 16, "hidden": 256, "heads": 4, "kv_heads": 2, "ffn_hidden": 512, "vocab": 1024}
CPU_STEP_MODEL = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 128, "vocab": 256}
STEP_RUNS = {"steps": (STEP_MODEL, 2048, 4), "host_bound_steps": (HOST_STEP_MODEL, 128, 1)}


def model_shapes() -> list[tuple[str, int, int, int]]:
    """(label, m, k, n) of each model's block GEMMs: fused QKV-sized, output, up, down."""
    out = []
    for label, (tokens, h, f) in MODEL_GEMMS.items():
        out += [(f"{label} qkv", tokens, h, 3 * h), (f"{label} out", tokens, h, h),
                (f"{label} up", tokens, h, f), (f"{label} down", tokens, f, h)]
    return out


def per_call(fn: Callable[[], Any], device: str, reps: int = 10, sample_s: float = 5e-3) -> float:
    """Median seconds per call of fn(), timing enough calls between two synchronisations
    that each sample lasts about `sample_s`: a 30 us kernel timed alone would carry the
    launch and the synchronisation (10-15 us on a GPU) as if they were its own."""
    one = synced_median(fn, device, reps=3, warmup=2)
    inner = max(1, min(100, round(sample_s / max(one, 1e-7))))

    def calls() -> None:
        for _ in range(inner):
            fn()
    return synced_median(calls, device, reps, warmup=1) / inner


def gemm_sweep(device: str, shapes: list[tuple[str, int, int, int]], reps: int = 10) -> list[dict[str, Any]]:
    """FLOP/s of each labelled (m, k, n) GEMM, random data, `reps` timed calls."""
    rows = []
    for label, m, k, n in shapes:
        a = torch.randn(m, k, device=device, dtype=training_dtype(device))
        b = torch.randn(k, n, device=device, dtype=training_dtype(device))
        seconds = per_call(lambda: a @ b, device, reps)
        rows.append({"label": label, "shape": [m, k, n], "seconds": seconds, "flops": 2.0 * m * k * n / seconds})
    return rows


def nvml_probe() -> Callable[[], dict[str, float]]:
    """A reader of GPU 0's SM clock (MHz), power (W) and temperature (C), or of nothing
    where NVML (nvidia-ml-py) is not installed or finds no GPU."""
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:
        return lambda: {}

    fields: dict[str, Callable[[], float]] = {
        "sm_clock_MHz": lambda: float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
        "power_W": lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,          # mW
        "temperature_C": lambda: float(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))}

    def read() -> dict[str, float]:     # a field this GPU or VM does not report is left out
        out = {}
        for name, get in fields.items():
            try:
                out[name] = get()
            except Exception:
                continue
        return out
    return read


def sustained_gemm(device: str, seconds: float, window: float = 1.0, n: int = 8192,
                   probe: Callable[[], dict[str, float]] | None = None) -> list[dict[str, Any]]:
    """The n^3 GEMM back to back for `seconds`: per `window`, its FLOP/s and what `probe`
    reads at the window's end."""
    probe = probe or (lambda: {})
    sync = synchronizer(device)
    a = torch.randn(n, n, device=device, dtype=training_dtype(device))
    b = torch.randn(n, n, device=device, dtype=training_dtype(device))
    flops = 2.0 * n ** 3
    windows, begin = [], time.perf_counter()
    while time.perf_counter() - begin < seconds:
        start, done = time.perf_counter(), 0
        while time.perf_counter() - start < window:
            for _ in range(4):
                _ = a @ b
            sync()
            done += 4
        elapsed = time.perf_counter() - start
        windows.append({"t_s": time.perf_counter() - begin, "flops": done * flops / elapsed, **probe()})
    return windows


def attention_flops(batch_heads: int, seq: int, head_dim: int) -> tuple[float, float]:
    """Causal attention FLOPs, forward and backward: QK^T and PV at 2 s^2 d each, half of
    them under the causal mask; the backward does 2.5 times the forward (FlashAttention-2
    paper, section 4: five matrix products to the forward's two)."""
    forward = 4.0 * batch_heads * seq * seq * head_dim / 2.0
    return forward, 2.5 * forward


def _backends() -> dict[str, Any]:
    """The SDPA backends to try, by name (torch.nn.attention.SDPBackend)."""
    from torch.nn.attention import SDPBackend
    names = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
             "math": "MATH"}
    return {k: getattr(SDPBackend, v) for k, v in names.items() if hasattr(SDPBackend, v)}


def attention_sweep(device: str, sequences: tuple[int, ...], tokens: int = 16384, heads: int = 16,
                    head_dim: int = 128, reps: int = 5) -> list[dict[str, Any]]:
    """Per SDPA backend that runs here and per sequence length: causal forward and backward
    seconds on (tokens / seq, heads, seq, head_dim) and their FLOP/s. A backend that refuses
    the shape or the device is recorded with its error."""
    from torch.nn.attention import sdpa_kernel
    rows = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for name, backend in _backends().items():
        if device.startswith("cuda") == (name == "math"):
            continue      # the math kernel is the CPU's; on a GPU the fused kernels
        for seq in sequences:
            batch = max(1, tokens // seq)
            q, k, v = (torch.randn(batch, heads, seq, head_dim, device=device, dtype=training_dtype(device),
                                   requires_grad=True) for _ in range(3))
            grad = torch.randn(batch, heads, seq, head_dim, device=device, dtype=training_dtype(device))
            row: dict[str, Any] = {"backend": name, "seq": seq, "batch": batch, "heads": heads, "head_dim": head_dim}
            try:
                with sdpa_kernel(backend):
                    forward = per_call(lambda: sdpa(q, k, v, is_causal=True), device, reps)
                    both = per_call(lambda: torch.autograd.grad(sdpa(q, k, v, is_causal=True), (q, k, v), grad),
                                    device, reps)
            except (RuntimeError, NotImplementedError) as error:   # no kernel for this shape here
                rows.append({**row, "error": str(error).splitlines()[0][:200]})
                continue
            f_flops, b_flops = attention_flops(batch * heads, seq, head_dim)
            backward = both - forward     # not positive: the two timings' noise exceeded it
            rows.append({**row, "forward_s": forward, "backward_s": backward, "forward_flops": f_flops / forward,
                         "backward_flops": b_flops / backward if backward > 0 else None})
    return rows


def memory_bound(device: str, elements: int, hidden: int = 4096, reps: int = 10) -> dict[str, float]:
    """Bytes per second (read + written) of a copy, an add and a LayerNorm over `elements`
    values of the device's training dtype."""
    dtype = training_dtype(device)
    size = torch.finfo(dtype).bits // 8
    x = torch.randn(elements, device=device, dtype=dtype)
    y, z = torch.empty_like(x), torch.randn_like(x)     # x + z: two buffers read (x + x reads one)
    rows = x.view(-1, hidden) if elements % hidden == 0 else x.view(1, -1)
    norm = nn.LayerNorm(rows.shape[-1], device=device, dtype=dtype)
    with torch.no_grad():
        return {"copy_Bps": 2 * elements * size / per_call(lambda: y.copy_(x), device, reps),
                "add_Bps": 3 * elements * size / per_call(lambda: torch.add(x, z, out=y), device, reps),
                "layernorm_Bps": 2 * elements * size / per_call(lambda: norm(rows), device, reps)}


def launch_gap(device: str, kernels: int = 1000) -> dict[str, float]:
    """Seconds per tiny dependent kernel: issued from Python one by one (the host's launch
    and the device's gap, whichever is longer) and, on CUDA, replayed from a graph (the
    device's gap between dependent kernels alone)."""
    x = torch.zeros(1, device=device)

    def chain() -> None:
        for _ in range(kernels):
            x.add_(1.0)
    out = {"eager_s": synced_median(chain, device, reps=5) / kernels}
    if device.startswith("cuda"):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            chain()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            chain()
        out["graph_s"] = synced_median(graph.replay, device, reps=5) / kernels
    return out


def _process_group(device: str) -> None:
    """A one-process group (NCCL on a GPU, gloo on a CPU) for FSDP2 and DeepSpeed."""
    if dist.is_initialized():
        return
    store = os.path.join(tempfile.mkdtemp(prefix="zerosim-device-"), "store")
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo", init_method=f"file://{store}",
                            rank=0, world_size=1)


def _deepspeed_engine(model: nn.Module, micro_batch: int, device: str) -> Any:
    os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517"})
    import deepspeed
    deepspeed.init_distributed(dist_backend="nccl" if device.startswith("cuda") else "gloo")
    config = {"train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-4, "torch_adam": True}},
              "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
              "bf16": {"enabled": device.startswith("cuda")},
              "zero_optimization": {"stage": 3}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return engine


def engine_steps(device: str, model_table: dict[str, int], seq_len: int, micro_batch: int,
                 reps: int = 5, deepspeed_too: bool = True) -> dict[str, Any]:
    """Seconds per training step (forward, cross-entropy, backward, Adam) of LlamaLike
    plain, under FSDP2 and, where DeepSpeed is installed and `deepspeed_too`, under ZeRO-3;
    medians of `reps` after warm-up. An engine that cannot run here is recorded with its
    error."""
    from sim.inputs.models import model_from_table
    from sim.validate.torch_models import LlamaLike
    spec = model_from_table(model_table, "device check", "model.")
    tokens = torch.randint(0, spec.vocab, (micro_batch, seq_len + 1), device=device)

    def fresh() -> nn.Module:      # the rotary buffers go to bf16 too: coarser positions, the same kernels
        torch.manual_seed(0)
        return LlamaLike(spec).to(device=device, dtype=training_dtype(device))

    def loss_of(model: Any) -> torch.Tensor:
        logits = model(tokens[:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, spec.vocab).float(), tokens[:, 1:].reshape(-1))

    def torch_step(model: nn.Module) -> Callable[[], None]:
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)

        def step() -> None:
            loss_of(model).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    out: dict[str, Any] = {"model": model_table, "seq_len": seq_len, "micro_batch": micro_batch,
                           "plain_s": synced_median(torch_step(fresh()), device, reps, warmup=2)}
    _process_group(device)
    try:
        from torch.distributed.fsdp import fully_shard
        model = fresh()
        for block in getattr(model, "model").layers:
            fully_shard(block)
        fully_shard(model)
        out["fsdp2_s"] = synced_median(torch_step(model), device, reps, warmup=2)
    except Exception as error:   # recorded, not fatal: the other sections still count
        out["fsdp2_error"] = f"{type(error).__name__}: {str(error)[:200]}"
    if not deepspeed_too:
        return out
    linear = nn.functional.linear     # ZeRO-3's Init replaces it process-wide (partition_parameters.py
    try:                              # `_enable_mem_efficient_linear`); later plain steps must not see that
        engine = _deepspeed_engine(fresh(), micro_batch, device)

        def ds_step() -> None:
            engine.backward(loss_of(engine))
            engine.step()
        out["deepspeed_zero3_s"] = synced_median(ds_step, device, reps, warmup=2)
    except Exception as error:
        out["deepspeed_zero3_error"] = f"{type(error).__name__}: {str(error)[:200]}"
    finally:
        nn.functional.linear = linear
    return out


def device_check(device: str, *, quick: bool = False, sustain_s: float = 30.0,
                 log: Callable[[str], None] = lambda _: None,
                 save: Callable[[dict[str, Any]], None] = lambda _: None) -> dict[str, Any]:
    """Every section on `device`; `quick`: tiny sizes (a CPU, the tests). A section that
    fails is recorded under "errors" and the others still run, and `save` gets the result
    after each section: a lent GPU's minutes are few, and neither one section's failure
    nor a run cut off at its time limit must lose the rest. Attention runs last: a kernel
    that faults leaves the CUDA context unusable for whatever follows."""
    started = time.time()
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    shapes = [("issue", *s) for s in ISSUE_SHAPES] + model_shapes()
    if quick:
        shapes = [(label, max(1, m // 64), max(1, k // 64), max(1, n // 64)) for label, m, k, n in shapes[:4]]
    steps = {"steps": (CPU_STEP_MODEL, 32, 2)} if quick else STEP_RUNS
    sections: list[tuple[str, Callable[[], Any]]] = [
        ("gemm", lambda: gemm_sweep(device, shapes, reps=3 if quick else 10)),
        ("sustained", lambda: sustained_gemm(device, 0.2 if quick else sustain_s, 0.1 if quick else 1.0,
                                             n=128 if quick else 8192, probe=nvml_probe())),
        ("memory", lambda: memory_bound(device, 2**16 if quick else 2**28, hidden=256 if quick else 4096)),
        ("launch", lambda: launch_gap(device, 50 if quick else 1000)),
    ] + [(key, _steps_of(device, model, seq_len, micro_batch, quick))
         for key, (model, seq_len, micro_batch) in steps.items()] + [
        ("attention", lambda: attention_sweep(device, (64, 128) if quick else SEQUENCES,
                                              tokens=256 if quick else 16384, heads=2 if quick else 16,
                                              head_dim=16 if quick else 128, reps=2 if quick else 5))]
    result: dict[str, Any] = {"device": device, "torch": torch.__version__,
                              "name": torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu",
                              "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)), "seconds": 0.0,
                              "errors": {}}
    for key, measure in sections:
        log(key.replace("_", " "))
        try:
            result[key] = measure()
        except Exception as error:
            result["errors"][key] = f"{type(error).__name__}: {str(error)[:300]}"
        result["seconds"] = time.time() - started
        save(result)
    if dist.is_initialized():
        dist.destroy_process_group()
    return result


def _steps_of(device: str, model: dict[str, int], seq_len: int, micro_batch: int,
              quick: bool) -> Callable[[], dict[str, Any]]:
    return lambda: engine_steps(device, model, seq_len, micro_batch, reps=2 if quick else 5, deepspeed_too=not quick)


def summary_lines(result: dict[str, Any]) -> list[str]:
    """A few lines of what the check measured (the JSON holds every number)."""
    lines = [f"GEMM {r['label']} {r['shape']}: {r['flops'] / 1e12:.1f} TFLOP/s" for r in result.get("gemm", [])]
    rates = [w["flops"] for w in result.get("sustained", [])]
    if rates:
        clocks = [w["sm_clock_MHz"] for w in result["sustained"] if "sm_clock_MHz" in w]
        clock = f", SM clock {min(clocks):.0f}-{max(clocks):.0f} MHz" if clocks else ""
        lines.append(f"sustained GEMM over {len(rates)} windows: first {rates[0] / 1e12:.1f}, last "
                     f"{rates[-1] / 1e12:.1f}, lowest {min(rates) / 1e12:.1f} TFLOP/s{clock}")
    for r in result.get("attention", []):
        if "error" in r:
            lines.append(f"attention {r['backend']} seq {r['seq']}: {r['error']}")
        else:
            backward = (f"backward {r['backward_flops'] / 1e12:.1f} TFLOP/s" if r["backward_flops"] is not None
                        else "backward below the timings' noise")
            lines.append(f"attention {r['backend']} seq {r['seq']}: forward {r['forward_flops'] / 1e12:.1f} "
                         f"TFLOP/s, {backward}")
    if "memory" in result:
        lines.append("memory-bound: " + ", ".join(f"{k[:-4]} {v / 1e9:.0f} GB/s" for k, v in result["memory"].items()))
    if "launch" in result:
        lines.append("per tiny kernel: " + ", ".join(f"{k[:-2]} {v * 1e6:.2f} us" for k, v in result["launch"].items()))
    for key in ("steps", "host_bound_steps"):
        if key in result:
            steps = result[key]
            lines.append(f"step, {steps['model']['layers']} layers x {steps['model']['hidden']}, "
                         f"{steps['micro_batch']} x {steps['seq_len']} tokens: " + ", ".join(
                             f"{k[:-2]} {v * 1e3:.1f} ms" if k.endswith("_s") else f"{k[:-6]}: {v}"
                             for k, v in steps.items() if k.endswith("_s") or k.endswith("_error")))
    lines += [f"{key} failed: {error}" for key, error in result.get("errors", {}).items()]
    return lines
