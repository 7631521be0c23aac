"""LoRA: trainable parameters and model-state memory under ZeRO (Hu et al., arXiv
2106.09685; reference/000 Sec. 5.4).

A rank-r adapter on a Linear of in x out adds A (r x in) and B (out x r): r (in + out)
trainable parameters. The frozen base is stored in 16 bits with no gradient and no
optimizer state; the adapters follow the mixed-precision Adam accounting (2 + 2 + K).
"""

from __future__ import annotations

from collections.abc import Iterable

from sim.analytic.memory import ModelStateBytes, shard_divisors
from sim.analytic.params import total_params
from sim.core.enums import ZeroStage
from sim.core.model import ModelSpec, module_tree

PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")


def projection_shape(m: ModelSpec, name: str) -> tuple[int, int]:
    """(in, out) of one projection of a block."""
    shapes = {"q": (m.hidden, m.q_dim), "k": (m.hidden, m.kv_dim), "v": (m.hidden, m.kv_dim),
              "o": (m.q_dim, m.hidden), "gate": (m.hidden, m.ffn_hidden),
              "up": (m.hidden, m.ffn_hidden), "down": (m.ffn_hidden, m.hidden)}
    if name not in shapes:
        raise ValueError(f"unknown LoRA target {name!r}; allowed: {', '.join(PROJECTIONS)}")
    return shapes[name]


def lora_trainable_params(m: ModelSpec, rank: int, targets: Iterable[str] = ("q", "k", "v", "o")) -> int:
    """Sum over layers and targets of r (in + out). Llama-2-13B, r 16, q/k/v/o: 26,214,400."""
    per_layer = sum(rank * sum(projection_shape(m, t)) for t in targets)
    return m.layers * per_layer


def lora_model_state_bytes(m: ModelSpec, rank: int, targets: Iterable[str], dp: int,
                           stage: ZeroStage, *, k: float = 12.0,
                           base_bytes_per_param: float = 2.0) -> ModelStateBytes:
    """Per-GPU bytes: frozen 16-bit base (sharded only at stage 3) + adapters under ZeRO.

    Llama-2-7B on 4 GPUs, ZeRO-2: the base alone is 13.5 GB per GPU, so LoRA + ZeRO-2 is
    bound by one copy of the base per GPU.
    """
    trainable = lora_trainable_params(m, rank, targets)
    base = base_bytes_per_param * total_params(m)
    p_div, g_div, o_div = shard_divisors(dp, stage)
    return ModelStateBytes(params=(base + 2.0 * trainable) / p_div,
                           grads=2.0 * trainable / g_div, optimizer=k * trainable / o_div)


def lora_states(m: ModelSpec, dp: int, stage: ZeroStage, *, k: float = 12.0) -> ModelStateBytes:
    """lora_model_state_bytes for a model that carries its LoRA config (`m.lora`): the
    frozen base and the adapters counted from the module tree (sim.core.model)."""
    tensors = [t for mod in module_tree(m) for t in mod.tensors]
    trainable = sum(t.numel for t in tensors if t.trainable)
    frozen = sum(t.numel for t in tensors if not t.trainable)
    p_div, g_div, o_div = shard_divisors(dp, stage)
    base_div = dp if stage == ZeroStage.PARAMETERS else 1
    return ModelStateBytes(params=2.0 * frozen / base_div + 2.0 * trainable / p_div,
                           grads=2.0 * trainable / g_div, optimizer=k * trainable / o_div)
