"""Two small measurements of the lecture (reference/000 Secs. 4.1 and 4.5), in torch.

- How many activation elements autograd saves for 12 pre-norm MLP blocks, with and
  without one checkpoint per block (counted with `torch.autograd.graph.saved_tensors_hooks`).
- Quantisation error of absmax INT8 / INT4, one scale per tensor vs one per 256 values,
  on 2^20 normal weights with 64 outliers 20x larger (relative L2 error).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class MlpBlock(nn.Module):
    """LayerNorm -> Linear(h, 4h) -> GELU -> Linear(4h, h), with a residual."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))


def checkpoint_saved_elements(blocks: int, shape: tuple[int, int, int]) -> tuple[int, int]:
    """(elements saved without checkpointing, with one checkpoint per block); parameters,
    which autograd also saves, are not activations and are not counted."""
    torch.manual_seed(0)
    model = nn.ModuleList(MlpBlock(shape[-1]) for _ in range(blocks))
    params = {p.data_ptr() for p in model.parameters()}

    def count(use_checkpoint: bool) -> int:
        saved: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            if t.data_ptr() not in params:
                saved[t.data_ptr()] = t.numel()
            return t

        x = torch.randn(*shape, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            h = x
            for block in model:
                h = checkpoint(block, h, use_reentrant=False) if use_checkpoint else block(h)
        return sum(saved.values())

    return count(False), count(True)


def quantization_errors(*, n: int = 2**20, outliers: int = 64, scale: float = 20.0, block: int = 256,
                        seed: int = 0) -> dict[str, float]:
    """Relative L2 error of symmetric absmax quantisation, per tensor and per block."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(n).astype(np.float32)
    w[rng.choice(n, outliers, replace=False)] *= scale
    out = {}
    for bits in (8, 4):
        qmax = 2 ** (bits - 1) - 1
        for name, groups in (("tensor", w.reshape(1, -1)), ("block", w.reshape(-1, block))):
            s = np.abs(groups).max(axis=1, keepdims=True) / qmax
            q = (np.round(groups / s) * s).reshape(-1)
            out[f"int{bits}_{name}"] = float(np.linalg.norm(w - q) / np.linalg.norm(w))
    return out
