"""What a transformer block really keeps from its forward to its backward, and what its
backward runs again, under activation checkpointing on CPU torch: the measurement behind
sim.analytic.op_sac and the full-recompute checkpoint size.

- Kept bytes: a TorchDispatchMode notes the storage of every tensor an op creates during
  the forward of a chain of blocks; after the forward, the storages still alive are what
  autograd, the checkpoint and its selective cache hold (and the chain's output). The
  difference between chains of n and n - 1 blocks is one block's kept bytes, whatever
  holds them.
- Recomputed FLOPs: a dispatch mode counts the matmuls the backward runs; with the policy
  minus without checkpointing is what the recomputation ran.

The per-op policy is torchtitan's rule (sim.analytic.op_sac) written against torch's public
selective-checkpoint API: save the output of the fused attention op and of every
odd-numbered matmul of the block's forward, recompute the rest.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from sim.core.model import ModelSpec
from sim.validate.torch_models import Block, RotaryEmbedding

MODES = ("none", "full", "selective-op")


def _attention_ops() -> set[Any]:
    """The fused scaled-dot-product-attention kernels torch may pick (CPU and CUDA)."""
    names = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")
    return {getattr(torch.ops.aten, n).default for n in names if hasattr(torch.ops.aten, n)}


def per_op_policy() -> Callable[..., CheckpointPolicy]:
    """A fresh policy for one block's forward: counts matmuls in call order, saves the
    odd-numbered ones and the attention op's outputs, recomputes the rest (torch consults
    it in the forward and replays its decisions in the recomputation)."""
    count = {"mm": 0}
    attention = _attention_ops()

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if op == torch.ops.aten.mm.default:
            count["mm"] += 1
            return CheckpointPolicy.MUST_SAVE if count["mm"] % 2 == 1 else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if op in attention else CheckpointPolicy.PREFER_RECOMPUTE
    return policy


class _MatmulFlops(TorchDispatchMode):
    """2 m n k for every aten.mm that runs (ops answered from the selective cache never
    reach this mode: the cache's own mode sits inside it)."""

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func == torch.ops.aten.mm.default:
            (m, k), (_, n) = args[0].shape, args[1].shape
            self.flops += 2 * m * n * k
        return func(*args, **(kwargs or {}))


def _run_block(block: Block, mode: str, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    if mode == "none":
        return block(x, cos, sin)
    if mode == "full":
        return checkpoint(block, x, cos, sin, use_reentrant=False)
    return checkpoint(block, x, cos, sin, use_reentrant=False,
                      context_fn=partial(create_selective_checkpoint_contexts, per_op_policy()))


class _Storages(TorchDispatchMode):
    """Weak references to the storage of every tensor an op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[int, weakref.ref[torch.UntypedStorage]] = {}
        self.nbytes: dict[int, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                self.seen[storage.data_ptr()] = weakref.ref(storage)
                self.nbytes[storage.data_ptr()] = storage.nbytes()
        return out

    def alive_bytes(self, before: set[int]) -> int:
        """Bytes of the storages still alive, less those that existed before (the
        parameters and inputs, which views made during the forward also show)."""
        gc.collect()
        return sum(self.nbytes[p] for p, ref in self.seen.items() if ref() is not None and p not in before)


def _chain(m: ModelSpec, blocks: int, tokens: tuple[int, int], mode: str) -> tuple[list[Block], torch.Tensor,
                                                                                   torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = [Block(m) for _ in range(blocks)]
    x = torch.randn(*tokens, m.hidden, requires_grad=True)
    cos, sin = RotaryEmbedding(m.head_dim)(tokens[1])
    return model, x, cos, sin


def kept_bytes(m: ModelSpec, blocks: int, tokens: tuple[int, int], mode: str) -> int:
    """Bytes alive after the forward of `blocks` blocks (batch, seq = `tokens`), created by it."""
    model, x, cos, sin = _chain(m, blocks, tokens, mode)
    before = {t.untyped_storage().data_ptr() for b in model for t in b.parameters()} | \
        {t.untyped_storage().data_ptr() for t in (x, cos, sin)}
    with _Storages() as storages:
        h = x
        for block in model:
            h = _run_block(block, mode, h, cos, sin)
    alive = storages.alive_bytes(before)
    del h
    return alive


def block_kept_bytes(m: ModelSpec, tokens: tuple[int, int], mode: str) -> int:
    """One block's kept bytes: a chain of three minus a chain of two."""
    return kept_bytes(m, 3, tokens, mode) - kept_bytes(m, 2, tokens, mode)


def backward_matmul_flops(m: ModelSpec, tokens: tuple[int, int], mode: str) -> tuple[int, torch.Tensor]:
    """Matmul FLOPs one block's backward runs (its recomputation included), and the input
    gradient it produces."""
    (block,), x, cos, sin = _chain(m, 1, tokens, mode)
    out = _run_block(block, mode, x, cos, sin).sum()
    with _MatmulFlops() as counter:
        out.backward()
    assert x.grad is not None
    return counter.flops, x.grad
