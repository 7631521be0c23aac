"""Real torch.distributed runs on CPU with gloo: DDP + Adam, DDP + ZeroRedundancyOptimizer
and FSDP2 (`fully_shard` per block), recorded collective by collective.

`spawn(world, worker, config)` starts `world` processes, each running `WORKERS[worker]`,
and returns what each rank returned. Everything is seeded: same inputs, same run.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from sim.models import model_from_table
from sim.validate.calibrate import measure_collectives, measure_compute
from sim.validate.recorder import CollectiveRecorder, state_bytes
from sim.validate.torch_models import LlamaLike, lecture_mlp


def spawn(world: int, worker: str, config: dict[str, Any], attempts: int = 2) -> list[dict[str, Any]]:
    """Run the worker on `world` processes. A process group that fails to start or dies is
    retried once (gloo rendezvous on a loaded 2-core machine has been seen to fail once in a
    full test run); what a run measures or records is never retried."""
    for attempt in range(attempts):
        with tempfile.TemporaryDirectory() as tmp:
            try:
                torch.multiprocessing.spawn(_entry, args=(world, worker, config, tmp), nprocs=world, join=True)
            except (torch.multiprocessing.ProcessRaisedException, torch.multiprocessing.ProcessExitedException):
                if attempt == attempts - 1:
                    raise
                continue
            return [torch.load(os.path.join(tmp, f"{r}.pt"), weights_only=False) for r in range(world)]
    raise AssertionError("unreachable")


def _entry(rank: int, world: int, worker: str, config: dict[str, Any], tmp: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world)
    try:
        result = WORKERS[worker](rank, world, config)
        torch.save(result, os.path.join(tmp, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _wrap(model: nn.Module, strategy: str, dtype: torch.dtype) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    """Wrap as the strategy does; returns (model, optimizer, zero-redundancy partition or None)."""
    model = model.to(dtype)
    if strategy.startswith("fsdp2"):
        from torch.distributed.fsdp import fully_shard
        reshard = strategy != "fsdp2-no-reshard"
        blocks = model.model.layers if hasattr(model, "model") else [m for m in model if isinstance(m, nn.Linear)]
        for block in blocks:
            fully_shard(block, reshard_after_forward=reshard)
        fully_shard(model)
        return model, torch.optim.Adam(model.parameters(), lr=1e-3), None
    from torch.nn.parallel import DistributedDataParallel
    ddp = DistributedDataParallel(model)
    if strategy == "ddp-zero-redundancy":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
        partition = [[p.numel() for g in groups for p in g["params"]] for groups in opt._partition_parameters()]
        return ddp, opt, partition
    return ddp, torch.optim.Adam(ddp.parameters(), lr=1e-3), None


def train_llama(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """Train a LlamaLike model; record the collectives of every step by phase."""
    spec = model_from_table(cfg["model"], "validation config", "model.")
    torch.manual_seed(0)
    model, opt, _ = _wrap(LlamaLike(spec), cfg["strategy"], torch.float32)
    recorder, steps = CollectiveRecorder(), []
    gen = torch.Generator().manual_seed(1000 + rank)
    accum = cfg["grad_accum"]
    with recorder:
        for step in range(cfg["steps"]):
            start = time.perf_counter()
            for mb in range(accum):
                tokens = torch.randint(0, spec.vocab, (cfg["micro_batch"], cfg["seq_len"] + 1), generator=gen)
                sync = mb == accum - 1 or not hasattr(model, "no_sync")
                ctx = model.no_sync() if not sync else contextlib.nullcontext()
                with ctx:
                    recorder.phase = f"{step}/forward"
                    logits = model(tokens[:, :-1])
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
    from sim.validate.deepspeed_runs import train_deepspeed   # deepspeed is optional
    return train_deepspeed(rank, world, cfg)


WORKERS = {"train_llama": train_llama, "compare_mlp": compare_mlp, "train_deepspeed": _deepspeed,
           "measure_collectives": measure_collectives, "measure_compute": measure_compute}
