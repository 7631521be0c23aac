"""torchtitan's per-op selective activation checkpointing (`recompute = "selective-op"`):
what a transformer block keeps from its forward and what its backward runs again.

torchtitan wraps every transformer block in torch.utils.checkpoint with a selective policy
(`activation_checkpoint.mode = "selective"`, `selective_ac_option = "op"`, the default of its
Llama 3 configs since 2024: torchtitan/parallelisms/parallelize_llama.py
`_apply_ac_to_transformer_block`, now torchtitan/distributed/activation_checkpoint.py
`SelectiveAC`). The policy sees every op of the block's forward:

- a matmul (aten.mm, a bias-free Linear) is counted in call order; the odd-numbered ones
  (1st, 3rd, ...) are saved, every second one is recomputed;
- the fused attention kernel (SDPA flash / memory-efficient / cuDNN) is saved: its output
  and its log-sum-exp (fp32, one value per head and token);
- every other op (norms, rotary, the MLP activation and product, residual adds, views) is
  recomputed.

A Llama block calls q, k, v, o, gate, up, down in that order: q, v, gate and down are
saved; k, o and up run again. Besides the saved outputs the checkpoint keeps the block's
input. The recomputation runs when the block's backward begins (`early_stop` off: the
whole forward region again, the saved ops answered from storage), so the block's full
activations are live during its backward.

Modelled for dense, bias-free models without LoRA with fused attention (a biased Linear
is an aten.addmm, which the policy saves without counting; MoE experts run grouped GEMMs):
sim.inputs.scenario_checks refuses the rest as not simulated yet. Sizes are per
tensor-parallel rank, as sim.analytic.activations counts them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sim.core.model import ModelSpec, Place, module_tree


@dataclass(frozen=True, slots=True)
class BlockMatmul:
    """One Linear of a block's forward, in call order: its output width per TP rank and
    its reduction dimension per rank (the GEMM is tokens x out x k)."""

    name: str
    out: int
    k: int
    saved: bool


def block_matmuls(m: ModelSpec, tp: int = 1) -> tuple[BlockMatmul, ...]:
    """The Linears of one transformer block in forward call order (sim.core.model.module_tree
    lists them so), each marked saved or recomputed by the policy's count."""
    if m.experts > 1 or m.lora is not None:
        raise ValueError("per-op selective checkpointing is modelled for dense models without LoRA")
    out: list[BlockMatmul] = []
    for mod in module_tree(replace(m, layers=1)):
        if mod.block is None or mod.kind != "linear":
            continue
        w = mod.tensors[0].shape
        out_features, in_features = (w[1], w[0]) if mod.conv1d else (w[0], w[1])
        if mod.place in (Place.ATTN_OUT, Place.FFN_OUT):     # row-parallel: the input is split
            width, k = out_features, -(-in_features // tp)
        else:                                               # column-parallel: the output is split
            width, k = -(-out_features // tp), in_features
        out.append(BlockMatmul(".".join(mod.name.split(".")[-2:]), width, k, saved=len(out) % 2 == 0))
    return tuple(out)


def kept_bytes_per_token(m: ModelSpec, *, tp: int = 1, sequence_parallel: bool = False,
                         value_bytes: int = 2) -> float:
    """Bytes a block keeps per token from forward to backward: its input (h values, 1/t of
    them with sequence parallelism), the saved matmul outputs, the attention output (q/t
    values) and its log-sum-exp (4 bytes per local head)."""
    heads = -(-m.heads // tp)
    block_input = value_bytes * m.hidden / (tp if sequence_parallel else 1)
    matmuls = value_bytes * sum(mm.out for mm in block_matmuls(m, tp) if mm.saved)
    attention = value_bytes * heads * m.head_dim + 4 * heads
    return block_input + matmuls + attention


def recomputed_flops_per_token(m: ModelSpec, tp: int = 1) -> float:
    """FLOPs per token of the matmuls a block's backward runs again (2 out k each)."""
    return sum(2.0 * mm.out * mm.k for mm in block_matmuls(m, tp) if not mm.saved)
