"""Host CPU per module hook of FSDP2 and DeepSpeed ZeRO-3 on this machine (`zerosim calibrate`).

A stack of `modules` Linear blocks under a root module that holds one Linear of its own
runs forward and backward, every process at once, plain and then wrapped by the framework
(FSDP2: `fully_shard` on every block and on the root, as the validation runs wrap; ZeRO-3:
`deepspeed.initialize` with every parameter partitioned). The wrapped pass costs more by
the framework's hooks and by the collectives they issue; those collectives are recorded
(sim.validate.recorder) and replayed alone with the same sizes, and their time subtracted:

    hook = (t_wrapped - t_plain - t_collectives) / hook calls

The hook calls are counted as the planners count them, one per module use per pass
(sim.engines.fsdp2 / deepspeed_zero3 `hook_calls`): FSDP2 one per unit (the blocks and the
root), DeepSpeed one per module that runs a forward (the root, the blocks and the root's
Linear), each in forward and in backward. The result is the `fsdp2_hook_us` /
`zero3_hook_us` of the calibrated profile, which a synchronous host (a CPU process) pays
inline between kernels (sim.des.host).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from sim.validate.measure import timed_median
from sim.validate.recorder import CollectiveRecorder

MODULES, WIDTH, ROWS = 16, 64, 8       # small enough that the hooks, not the kernels, dominate


class Stack(nn.Module):
    def __init__(self, modules: int, width: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(modules))
        self.head = nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _replay(log: list[Any], world: int) -> Callable[[], None]:
    """The recorded collectives (fp32 buffers of the recorded sizes), one after the other."""
    buffers = []
    for c in log:
        n = max(world, c.nbytes // 4) // world * world
        buffers.append((c.op, torch.ones(n), torch.ones(n // world)))

    def run() -> None:
        for op, full, shard in buffers:
            if op == "all_gather":
                dist.all_gather_into_tensor(full, shard)
            elif op == "reduce_scatter":
                dist.reduce_scatter_tensor(shard, full)
            elif op == "broadcast":
                dist.broadcast(full, src=0)
            else:
                dist.all_reduce(full)
    return run


def _wrapped(engine: str, model: Stack, world: int, rank: int) -> tuple[Callable[[torch.Tensor], None],
                                                                       Callable[[], None]]:
    """One forward and backward of `model` wrapped by `engine`, and what must follow it
    untimed (DeepSpeed: its optimizer step, which a training backward expects)."""
    if engine == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        return (lambda x: model(x).sum().backward()), (lambda: None)
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "LOCAL_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29512"})
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
    config = {"train_micro_batch_size_per_gpu": ROWS, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
              "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "stage3_model_persistence_threshold": 0}}
    ds, _, _, _ = deepspeed.initialize(model=model, model_parameters=None, config=config)
    return (lambda x: ds.backward(ds(x).sum())), ds.step


def measure_hooks(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """Seconds of host CPU per hook call of cfg["engine"] ('fsdp2' or 'deepspeed'), and the
    parts it was derived from."""
    engine, reps = cfg["engine"], cfg.get("reps", 10)
    modules = cfg.get("modules", MODULES)
    torch.manual_seed(0)
    x = torch.randn(ROWS, WIDTH)
    plain = Stack(modules, WIDTH)
    t_plain = timed_median(lambda: plain(x).sum().backward(), reps)
    wrapped, after = _wrapped(engine, Stack(modules, WIDTH), world, rank)
    recorder = CollectiveRecorder()
    wrapped(x)
    after()
    with recorder:
        wrapped(x)
    after()
    t_wrapped = timed_median(lambda: wrapped(x), reps, after)
    t_coll = timed_median(_replay(recorder.log, world), reps)
    calls = 2 * (modules + 1) if engine == "fsdp2" else 2 * (modules + 2)
    hook = max(0.0, t_wrapped - t_plain - t_coll) / calls
    return {"hook_s": hook, "plain_s": t_plain, "wrapped_s": t_wrapped, "collectives_s": t_coll,
            "collectives": len(recorder.log), "calls": calls}
