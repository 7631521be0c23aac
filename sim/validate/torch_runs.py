"""Real torch.distributed runs on CPU with gloo: DDP + Adam, DDP + ZeroRedundancyOptimizer
and FSDP2 (`fully_shard` per block), on our LlamaLike or on Hugging Face's LlamaForCausalLM,
recorded collective by collective.

`spawn(world, worker, config)` starts `world` processes, each running `WORKERS[worker]`,
and returns what each rank returned. Everything is seeded: same inputs, same run. Every run
has a deadline (`timeout_s`): a run that does not finish is stopped and reported, never
retried. With a log path, each rank writes its stdout and stderr (C level included) there.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.multiprocessing.spawn import ProcessException

from sim.inputs.models import model_from_table
from sim.validate.build_locks import check_build_locks, stale_build_locks
from sim.validate.measure import gemm_rate, measure_collectives, measure_compute
from sim.validate.measure_hooks import measure_hooks
from sim.validate.recorder import CollectiveRecorder, state_bytes
from sim.validate.torch_models import LlamaLike, hf_llama, lecture_mlp

DEFAULT_TIMEOUT_S = 300.0
_settings: dict[str, Any] = {"timeout_s": DEFAULT_TIMEOUT_S, "log": None}


class RunTimeout(TimeoutError):
    """A torch run that did not finish by its deadline (its processes have been stopped)."""


@contextlib.contextmanager
def run_settings(*, timeout_s: float | None = None, log: str | os.PathLike[str] | None = None) -> Iterator[None]:
    """Defaults for every `spawn` inside (calibrate() and the timing runs call it for us)."""
    saved = dict(_settings)
    if timeout_s is not None:
        _settings["timeout_s"] = timeout_s
    if log is not None:
        _settings["log"] = os.fspath(log)
    try:
        yield
    finally:
        _settings.update(saved)


def describe(worker: str, world: int, config: dict[str, Any]) -> str:
    """'the train_llama run (world 2, strategy fsdp2, HF Llama)' for messages."""
    parts = [f"world {world}"]
    if config.get("strategy"):
        parts.append(f"strategy {config['strategy']}")
    elif isinstance(config.get("zero"), dict):
        parts.append(f"DeepSpeed ZeRO stage {config['zero'].get('stage')}")
    if config.get("hf"):
        parts.append("HF Llama")
    return f"the {worker} run ({', '.join(parts)})"


def spawn(world: int, worker: str, config: dict[str, Any], attempts: int = 2, *,
          timeout_s: float | None = None, log: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """Run the worker on `world` processes; raise RunTimeout if they have not all finished
    within `timeout_s` seconds (default: run_settings', 300 s).

    A process group that fails to START is retried once: gloo's rendezvous on a loaded 2-core
    machine has been seen to fail once in a full test run, and a fresh file store fixes it.
    "Started" means the failing rank got through init_process_group (each rank leaves a mark
    after it); a failure after that (the worker's own error, a crash) and a timeout are
    never retried: what a run measures or records is deterministic or worth seeing.
    """
    timeout_s = _settings["timeout_s"] if timeout_s is None else timeout_s
    log = _settings["log"] if log is None else os.fspath(log)
    if any(str(w).startswith("train_deepspeed") for w in (worker, config.get("worker"))):
        check_build_locks()   # DeepSpeed may build ops just in time: a stale lock hangs every rank
    for attempt in range(attempts):
        with tempfile.TemporaryDirectory() as tmp:
            try:
                _run(world, worker, config, tmp, timeout_s, log)
            except ProcessException as error:
                if _all_saved(tmp, world):
                    _note(log, f"rank {error.error_index} failed after every rank had saved its results "
                          f"(at teardown): {error}; the results are complete and used")
                    return _results(tmp, world)
                started = os.path.exists(os.path.join(tmp, f"{error.error_index}.started"))
                if started or attempt == attempts - 1:
                    raise
                continue
            return _results(tmp, world)
    raise AssertionError("unreachable")


def _all_saved(tmp: str, world: int) -> bool:
    """Every rank finished its worker and wrote its results (what it recorded is whole)."""
    return all(os.path.exists(os.path.join(tmp, f"{r}.done")) for r in range(world))


def _results(tmp: str, world: int) -> list[dict[str, Any]]:
    return [torch.load(os.path.join(tmp, f"{r}.pt"), weights_only=False) for r in range(world)]


def _note(log: str | None, text: str) -> None:
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"--- {text}\n")


def _run(world: int, worker: str, config: dict[str, Any], tmp: str, timeout_s: float, log: str | None) -> None:
    ctx = torch.multiprocessing.start_processes(_entry, args=(world, worker, config, tmp, log), nprocs=world,
                                                join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=max(0.0, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            _stop(ctx.processes)
            raise RunTimeout(_timeout_message(worker, world, config, timeout_s, log))


def _stop(processes: list[Any], grace_s: float = 5.0) -> None:
    """SIGTERM (a rank runs its `finally` blocks, so a build it holds releases its lock),
    then SIGKILL whatever is still alive after `grace_s`."""
    for p in processes:
        if p.is_alive():
            p.terminate()
    end = time.monotonic() + grace_s
    for p in processes:
        p.join(max(0.0, end - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def _timeout_message(worker: str, world: int, config: dict[str, Any], timeout_s: float, log: str | None) -> str:
    text = f"{describe(worker, world, config)} did not finish in {timeout_s:g} s; its processes were stopped"
    locks = stale_build_locks()
    if locks:
        text += (f"; {locks[0][0]} is a stale build lock from an interrupted torch extension build, for "
                 "which DeepSpeed waits forever: no build is running, so remove it and run again")
    else:
        text += "; allow more time with --timeout SECONDS"
    return text + (f" (output of the run: {log})" if log else "")


def _terminated(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _entry(rank: int, world: int, worker: str, config: dict[str, Any], tmp: str, log: str | None) -> None:
    if log:   # C-level prints too: the descriptors, not just sys.stdout / sys.stderr
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        print(f"--- {describe(worker, world, config)}: rank {rank}, pid {os.getpid()}", flush=True)
    signal.signal(signal.SIGTERM, _terminated)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world)
    open(os.path.join(tmp, f"{rank}.started"), "w").close()
    try:
        probe = config.get("speed_probe")
        before = gemm_rate(probe) if probe else 0.0
        result = WORKERS[worker](rank, world, config)
        if probe:   # the machine's GEMM rate around the run (sim.validate.timing)
            result["probe_flops"] = math.sqrt(before * gemm_rate(probe))
        torch.save(result, os.path.join(tmp, f"{rank}.pt"))
        open(os.path.join(tmp, f"{rank}.done"), "w").close()   # after the save: the results are whole
    finally:
        dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()


def _hsdp_mesh() -> Any:
    """HSDP's (replicate, shard) mesh of two replicas (torch init_device_mesh, shard fastest)."""
    from torch.distributed.device_mesh import init_device_mesh
    world = dist.get_world_size()
    return init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))


def _tensor_parallel(model: nn.Module) -> Any:
    """torchtitan's TP plan (torchtitan/models/llama3/infra/parallelize.py, with sequence
    parallelism) on a (dp, 2) mesh, tp innermost; returns the dp mesh for fully_shard."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    tp = mesh["tp"]
    parallelize_module(model, tp, {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "model.norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    })
    for block in getattr(getattr(model, "model"), "layers"):
        parallelize_module(block, tp, {
            "input_layernorm": SequenceParallel(),
            "self_attn": PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                            desired_input_layouts=(Replicate(), None, None)),
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
            "post_attention_layernorm": SequenceParallel(),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
        })
    return mesh["dp"]


def _wrap(model: nn.Module, strategy: str, dtype: torch.dtype, *, broadcast_buffers: bool = True,
          reshard_root: bool | None = None) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    """Wrap as the strategy does; returns (model, optimizer, zero-redundancy partition or None).

    FSDP2: `fully_shard` on each transformer block (`model.model.layers`, ours and HF's),
    then on the root with `reshard_after_forward=reshard_root` when given (torch's default,
    None, keeps the root's parameters gathered between forward and backward); "fsdp2-hsdp"
    on a (2, world / 2) replicate x shard mesh, "fsdp2-reshard-2" resharding the blocks to
    2-way groups after forward. DDP:
    `broadcast_buffers` as DistributedDataParallel's argument (rank 0's buffers are
    broadcast at the start of every synchronising forward when there are any)."""
    model = model.to(dtype)
    if strategy.startswith("fsdp2"):
        from torch.distributed.fsdp import fully_shard
        reshard: bool | int = {"fsdp2-no-reshard": False, "fsdp2-reshard-2": 2}.get(strategy, True)
        mesh = _hsdp_mesh() if strategy == "fsdp2-hsdp" else None
        if strategy == "fsdp2-tp2":
            mesh = _tensor_parallel(model)
        blocks = (list(getattr(getattr(model, "model"), "layers")) if hasattr(model, "model")
                  else [m for m in model.children() if isinstance(m, nn.Linear)])
        for block in blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        if reshard_root is None:
            fully_shard(model, mesh=mesh)
        else:
            fully_shard(model, mesh=mesh, reshard_after_forward=reshard_root)
        return model, torch.optim.Adam(model.parameters(), lr=1e-3), None
    from torch.nn.parallel import DistributedDataParallel
    # only when False: torch 2.13 deprecates the argument (FutureWarning) but its replacement,
    # forward_sync_buffers=False, still broadcasts at construction; True is the default
    if broadcast_buffers:
        ddp = DistributedDataParallel(model)
    else:
        ddp = DistributedDataParallel(model, broadcast_buffers=False)
    if strategy == "ddp-zero-redundancy":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
        groups_per_rank = getattr(opt, "_partition_parameters")()   # the greedy split, one list per rank
        partition = [[p.numel() for g in groups for p in g["params"]] for groups in groups_per_rank]
        return ddp, opt, partition
    return ddp, torch.optim.Adam(ddp.parameters(), lr=1e-3), None


def train_llama(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """Train a LlamaLike model, or with cfg["hf"] Hugging Face's LlamaForCausalLM of the same
    sizes; record the collectives of every step by phase. Options: "broadcast_buffers"
    (DDP, default True), "reshard_root" (FSDP2's root, default None: torch's default),
    "record" (default True; False for timing: the recorder is a TorchDispatchMode that sees
    every aten op in Python, which costs the step several microseconds per op)."""
    spec = model_from_table(cfg["model"], "validation config", "model.")
    torch.manual_seed(0)
    net = hf_llama(spec, cfg["seq_len"]) if cfg.get("hf") else LlamaLike(spec)
    model, opt, _ = _wrap(net, cfg["strategy"], torch.float32, broadcast_buffers=cfg.get("broadcast_buffers", True),
                          reshard_root=cfg.get("reshard_root"))
    recorder, steps = CollectiveRecorder(), []
    gen = torch.Generator().manual_seed(1000 + rank)
    accum = cfg["grad_accum"]
    with recorder if cfg.get("record", True) else contextlib.nullcontext():
        for step in range(cfg["steps"]):
            start = time.perf_counter()
            for mb in range(accum):
                tokens = torch.randint(0, spec.vocab, (cfg["micro_batch"], cfg["seq_len"] + 1), generator=gen)
                sync = mb == accum - 1 or not hasattr(model, "no_sync")
                ctx = getattr(model, "no_sync")() if not sync else contextlib.nullcontext()
                with ctx:
                    recorder.phase = f"{step}/forward"
                    out = model(input_ids=tokens[:, :-1]) if cfg.get("hf") else model(tokens[:, :-1])
                    logits = out.logits if cfg.get("hf") else out
                    loss = nn.functional.cross_entropy(logits.reshape(-1, spec.vocab), tokens[:, 1:].reshape(-1))
                    recorder.phase = f"{step}/backward"
                    (loss / accum).backward()
            recorder.phase = f"{step}/optimizer"
            opt.step()
            opt.zero_grad(set_to_none=False)
            steps.append(time.perf_counter() - start)
    held = state_bytes(model, opt)
    return {"log": [vars(c) for c in recorder.log], "state": held, "step_s": steps}


def compare_mlp(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """Train the lecture's MLP for `steps` Adam steps; return parameters and what is held."""
    dtype = torch.float64 if cfg.get("float64") else torch.float32
    torch.manual_seed(0)
    model, opt, partition = _wrap(lecture_mlp(), cfg["strategy"], dtype)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(cfg["steps"]):
        x = torch.randn(16, 64, generator=gen, dtype=dtype)
        y = torch.randn(16, 8, generator=gen, dtype=dtype)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    full = [p.full_tensor() if hasattr(p, "full_tensor") else p.detach() for p in model.parameters()]
    local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
    local_opt = getattr(opt, "optim", opt)   # ZeroRedundancyOptimizer wraps a local optimizer
    state_numel = sum((v.to_local() if hasattr(v, "to_local") else v).numel() for st in local_opt.state.values()
                      for v in st.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    return {"params": torch.cat([p.detach().reshape(-1) for p in full]),
            "local_shapes": [tuple(p.shape) for p in local], "local_params": sum(p.numel() for p in local),
            "state_numel": state_numel, "partition": partition}


def _deepspeed(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    from sim.validate.deepspeed_runs import train_deepspeed  # deepspeed is optional
    return train_deepspeed(rank, world, cfg)


def _deepspeed_pipe(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    from sim.validate.deepspeed_pipe_runs import train_deepspeed_pipe  # deepspeed is optional
    return train_deepspeed_pipe(rank, world, cfg)


def compute_and_hooks(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """measure_compute, then the hook cost of each of cfg["hook_engines"] (sim.validate.measure_hooks)
    in the same processes: one process group start fewer per calibration."""
    out = measure_compute(rank, world, cfg)
    out["hooks"] = {e: measure_hooks(rank, world, {"engine": e})["hook_s"] for e in cfg.get("hook_engines", ())}
    return out


def idle(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """Sleep cfg["seconds"], or raise cfg["raise"] (tests of the deadline and the retry rule)."""
    if cfg.get("raise"):
        os.write(2, f"rank {rank}: written at the C level\n".encode())   # what a log must capture
        raise RuntimeError(cfg["raise"])
    time.sleep(cfg.get("seconds", 0.0))
    return {"rank": rank}


def cases(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """Several runs of the worker cfg["worker"], one per config of cfg["cases"], one after
    another in the same process group: one start (about 8 s for 4 processes on 2 cores) and
    one import of transformers for all of them."""
    worker = WORKERS[cfg["worker"]]
    return {"cases": [worker(rank, world, case) for case in cfg["cases"]]}


WORKERS = {"train_llama": train_llama, "compare_mlp": compare_mlp, "train_deepspeed": _deepspeed,
           "train_deepspeed_pipe": _deepspeed_pipe,
           "measure_collectives": measure_collectives, "measure_compute": compute_and_hooks, "idle": idle,
           "cases": cases}
