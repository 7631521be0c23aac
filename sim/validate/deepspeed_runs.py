"""DeepSpeed ZeRO-1/2/3 on CPU: its CPU accelerator falls back to gloo (reference 2.6), so
the engine runs in the same gloo process groups as the torch runs, recorded the same way."""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import torch
from torch import nn

from sim.core.model import ModelSpec
from sim.inputs.models import model_from_table
from sim.validate.recorder import CollectiveRecorder
from sim.validate.torch_models import LlamaLike


def ds_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The DeepSpeed config of a validation run: fp32, torch Adam, no clipping."""
    return {"train_micro_batch_size_per_gpu": cfg["micro_batch"], "gradient_accumulation_steps": cfg["grad_accum"],
            "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
            "gradient_clipping": 0.0, "zero_allow_untested_optimizer": True,
            "zero_optimization": cfg["zero"], "steps_per_print": 10**9}


def start_deepspeed(rank: int, world: int, cfg: dict[str, Any], port: int) -> ModelSpec:
    """This rank's environment for DeepSpeed's launcher-less start (cfg["port"], else `port`),
    its gloo process group, the validation model's spec and torch's seed (identical ranks)."""
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "LOCAL_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(cfg.get("port", port))})
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    spec = model_from_table(cfg["model"], "validation config", "model.")
    torch.manual_seed(0)
    return spec


def train_deepspeed(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    spec = start_deepspeed(rank, world, cfg, 29511)
    import deepspeed

    engine, _, _, _ = deepspeed.initialize(model=LlamaLike(spec), model_parameters=None,
                                           config=ds_config(cfg))
    recorder, steps = CollectiveRecorder(), []
    gen = torch.Generator().manual_seed(1000 + rank)
    with recorder if cfg.get("record", True) else contextlib.nullcontext():   # off for timing
        for step in range(cfg["steps"]):
            start = time.perf_counter()
            for _ in range(cfg["grad_accum"]):
                tokens = torch.randint(0, spec.vocab, (cfg["micro_batch"], cfg["seq_len"] + 1), generator=gen)
                recorder.phase = f"{step}/forward"
                logits = engine(tokens[:, :-1])
                loss = nn.functional.cross_entropy(logits.reshape(-1, spec.vocab), tokens[:, 1:].reshape(-1))
                recorder.phase = f"{step}/backward"
                engine.backward(loss)
                recorder.phase = f"{step}/optimizer"
                engine.step()
            steps.append(time.perf_counter() - start)
    return {"log": [vars(c) for c in recorder.log], "step_s": steps, "optimizer_bytes": _optimizer_bytes(engine)}


def _optimizer_bytes(engine: Any) -> int:
    """fp32 master partitions plus Adam state, as DeepSpeed's ZeRO optimizers hold them
    (stage_1_and_2.py `single_partition_of_fp32_groups`, stage3.py `fp32_partitioned_groups_flat`)."""
    zero = engine.optimizer
    masters = getattr(zero, "single_partition_of_fp32_groups", None) or getattr(zero, "fp32_partitioned_groups_flat", [])
    inner = getattr(zero, "optimizer", zero)
    state = [v for st in inner.state.values() for v in st.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    return sum(t.numel() * t.element_size() for t in [*masters, *state])
