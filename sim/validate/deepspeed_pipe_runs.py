"""DeepSpeed's PipelineEngine on CPU (gloo): the validation model cut into a PipelineModule,
trained with `train_batch`, its point-to-point sends and receives recorded in issue order
(sim.validate.recorder), to compare with the DeepSpeed pipeline the planner replays
(sim.engines.policies.DeepSpeedTrainSchedule)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from sim.core.model import ModelSpec
from sim.validate.deepspeed_runs import ds_config, start_deepspeed
from sim.validate.recorder import CollectiveRecorder
from sim.validate.torch_models import Block, RMSNorm, RotaryEmbedding


class Embed(nn.Module):
    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(m.vocab, m.hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(tokens)


class PipeBlock(nn.Module):
    """A decoder block that takes and returns the hidden states alone (what a pipeline stage
    hands on), its rotary angles computed from the sequence length."""

    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        self.block = Block(m)
        self.rotary = RotaryEmbedding(m.head_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cos, sin = self.rotary(x.shape[1])
        return self.block(x, cos, sin)


class Head(nn.Module):
    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        self.norm = RMSNorm(m.hidden)
        self.lm_head = nn.Linear(m.hidden, m.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(x))


def pipeline_layers(m: ModelSpec) -> list[nn.Module]:
    """Embedding, the blocks, final norm and head: the planner's stage split (embedding on the
    first stage, head on the last) under DeepSpeed's 'uniform' partition when each stage
    gets one block."""
    return [Embed(m), *(PipeBlock(m) for _ in range(m.layers)), Head(m)]


def _loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def train_deepspeed_pipe(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """`world` pipeline stages (dp 1), cfg["steps"] calls of `train_batch` of cfg["grad_accum"]
    micro-batches; the log holds every send and receive, phase = the step."""
    spec = start_deepspeed(rank, world, cfg, 29513)
    import deepspeed
    from deepspeed.pipe import PipelineModule

    module = PipelineModule(layers=pipeline_layers(spec), num_stages=world, loss_fn=_loss,
                            partition_method="uniform")
    config = {**ds_config(cfg), "train_batch_size": cfg["micro_batch"] * cfg["grad_accum"]}
    engine, _, _, _ = deepspeed.initialize(model=module, model_parameters=list(module.parameters()), config=config)
    recorder = CollectiveRecorder()
    gen = torch.Generator().manual_seed(1000)
    with recorder:
        for step in range(cfg["steps"]):
            recorder.phase = f"{step}/pipeline"
            tokens = [torch.randint(0, spec.vocab, (cfg["micro_batch"], cfg["seq_len"] + 1), generator=gen)
                      for _ in range(cfg["grad_accum"])]
            engine.train_batch(data_iter=iter([(t[:, :-1], t[:, 1:]) for t in tokens]))
    return {"log": [vars(c) for c in recorder.log], "stage": engine.stage_id}
