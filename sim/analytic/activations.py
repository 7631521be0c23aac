"""Activation memory: the ZeRO paper's rough estimate, Korthikanti et al.'s per-layer
formula, a saved-tensor count for any catalog model, and partitioned checkpoints (P_a).

All sizes are bytes of 16-bit activations unless stated; s = sequence length,
b = micro-batch, h = hidden, a = heads, t = tensor-parallel degree, L = layers.
"""

from __future__ import annotations

from dataclasses import replace

from sim.analytic import op_sac
from sim.core.enums import Recompute
from sim.core.model import Family, ModelSpec, Place, module_tree


def zero_paper_activation_bytes(layers: int, hidden: int, seq_len: int, batch: int) -> float:
    """ZeRO paper Sec. 3.2 rough estimate, ~ 12 * L * h * s * b fp16 values.

    The paper gives only the proportionality (layers x hidden x sequence x batch) and one
    number: ~60 GB for GPT-2 1.5B (L 48, h 1600, s 1024, b 32); the constant 12 elements
    (24 bytes) per L*h*s*b is the one that reproduces it (60.4 GB). It ignores the
    attention-score term that Korthikanti et al. count.
    """
    return 24.0 * layers * hidden * seq_len * batch


def korthikanti_layer_bytes(seq_len: int, batch: int, hidden: int, heads: int, *, tp: int = 1,
                            sequence_parallel: bool = False,
                            recompute: Recompute = Recompute.NONE) -> float:
    """Per-layer activations of a GPT block (Korthikanti et al., arXiv 2205.05198, Table 2).

    none, no TP:        s b h (34 + 5 a s / h)
    TP t:               s b h (10 + 24/t + 5 a s / (h t))
    TP t + seq. par.:   s b h (34 + 5 a s / h) / t
    selective:          the 5 a s / h term disappears
    full:               2 s b h (the block input), / t with sequence parallelism
    """
    sbh = seq_len * batch * hidden
    if recompute is Recompute.FULL:
        return 2.0 * sbh / (tp if sequence_parallel else 1)
    scores = 0.0 if recompute is Recompute.SELECTIVE else 5.0 * heads * seq_len / hidden
    if sequence_parallel:
        return sbh * (34.0 + scores) / tp
    return sbh * (10.0 + 24.0 / tp + scores / tp)


def layer_activation_bytes(m: ModelSpec, seq_len: int, batch: int, *, tp: int = 1,
                           sequence_parallel: bool = False,
                           recompute: Recompute = Recompute.NONE, value_bytes: int = 2,
                           flash: bool = False) -> float:
    """Saved tensors of one block of `m`, summed the way Korthikanti et al. do (bytes).

    Per token: replicated across TP (unless sequence parallel) are the two norm inputs
    (2h each), the QKV and MLP inputs (2h each) and, with dropout (GPT family), two
    dropout masks (h each). Split by TP: Q, K, V (2(q + 2kv)), the output-projection
    input (2q) and the MLP intermediates (plain: GeLU input + fc2 input, 4I; gated, as
    HF's unfused SwiGLU: gate, silu(gate), up, product, 8I). Attention core: softmax
    output 2as, plus mask as and dropout output 2as with dropout. For GPT-2 shapes this
    is exactly 34 s b h + 5 a s^2 b. A fused (`flash`) attention kernel keeps no scores:
    only its output (the projection input above) and the log-sum-exp of each row, 4 bytes
    per head and token in fp32 (Dao et al. 2022 Sec. 3.1: O(N) memory; dropout is
    regenerated from the RNG state), with or without selective recomputation. MoE layers
    keep the top-k experts' intermediates. `value_bytes` = 4 for fp32 training scales
    everything but the log-sum-exp (masks included, a slight excess). torchtitan's per-op
    selective checkpointing keeps what sim.analytic.op_sac counts.
    """
    h, s, b = m.hidden, seq_len, batch
    scale = value_bytes / 2
    if recompute is Recompute.FULL:
        return scale * 2.0 * s * b * h / (tp if sequence_parallel else 1)
    if recompute is Recompute.SELECTIVE_OP:
        return op_sac.kept_bytes_per_token(m, tp=tp, sequence_parallel=sequence_parallel,
                                           value_bytes=value_bytes) * s * b
    dropout = m.family is Family.GPT2
    replicated = 8 * h + (2 * h if dropout else 0)
    intermediates = (8 if m.gated_mlp else 4) * m.ffn_hidden * min(m.experts_per_token, m.experts)
    split = 2 * (m.q_dim + 2 * m.kv_dim) + 2 * m.q_dim + intermediates
    if flash:
        core = 4.0 * m.heads / scale       # unscaled: the log-sum-exp is fp32 whatever the training precision
    else:
        core = 0.0 if recompute is Recompute.SELECTIVE else (5 if dropout else 2) * m.heads * s
    if m.lora is not None:   # tp = 1 with LoRA (refused otherwise)
        split += lora_saved_change(m)
    per_token = (replicated + split + core) / tp if sequence_parallel else replicated + (split + core) / tp
    return scale * per_token * s * b


def lora_saved_change(m: ModelSpec) -> int:
    """Bytes per token (16-bit) a LoRA block saves more (+) or less (-) than full fine-tuning:
    a frozen Linear needs no weight gradient, so autograd does not keep its input for it:
    the QKV input (2h) unless a q / k / v projection is targeted, the output projection's
    input (2q) unless it is, the MLP input (2h) unless an input projection is, the output
    projection's input (2I: the gated product or the GeLU output) unless it is; each adapter
    keeps the rank-r output of its lora_A (2r). MoE blocks: no change counted."""
    if m.lora is None or m.experts > 1:
        return 0
    mods = module_tree(replace(m, layers=1))
    targeted = {mod.place for mod in mods if mod.wrapper and not mod.lora}   # the wrapped base layers
    adapters = sum(1 for mod in mods if mod.lora == "B")
    change = 2 * m.lora.rank * adapters
    for place, saved in ((Place.QKV, 2 * m.hidden), (Place.ATTN_OUT, 2 * m.q_dim), (Place.FFN_IN, 2 * m.hidden),
                         (Place.FFN_OUT, 2 * m.ffn_hidden)):
        if place not in targeted:
            change -= saved
    return change


def recompute_working_bytes(m: ModelSpec, seq_len: int, batch: int, *, tp: int = 1,
                            sequence_parallel: bool = False, recompute: Recompute,
                            value_bytes: int = 2, flash: bool = False) -> float:
    """Extra live bytes while one block is recomputed in backward: its full activations
    (full recompute), or what they hold beyond the saved ones (per-op selective)."""
    if recompute not in (Recompute.FULL, Recompute.SELECTIVE_OP):
        return 0.0
    full = layer_activation_bytes(m, seq_len, batch, tp=tp, sequence_parallel=sequence_parallel,
                                  value_bytes=value_bytes, flash=flash)
    if recompute is Recompute.FULL:
        return full
    kept = layer_activation_bytes(m, seq_len, batch, tp=tp, sequence_parallel=sequence_parallel,
                                  recompute=recompute, value_bytes=value_bytes)
    return max(0.0, full - kept)


def outside_layers_activation_bytes(m: ModelSpec, seq_len: int, batch: int, *, tp: int = 1,
                                    value_bytes: int = 2, fused_loss: bool = False) -> float:
    """Embedding dropout mask (GPT), final-norm and head inputs (2sbh each in 16 bits) and
    fp32 logits for the loss (4 s b V / t, vocab-parallel) - Korthikanti et al. Sec. 4.3.
    A fused cross-entropy (flash-attn's) keeps the 16-bit logits instead and one fp32
    log-sum-exp per token."""
    s, b, h = seq_len, batch, m.hidden
    mask = s * b * h if m.family is Family.GPT2 else 0
    logits = (value_bytes * m.vocab / tp + 4.0) * s * b if fused_loss else 4.0 * s * b * m.vocab / tp
    return mask + 2.0 * value_bytes * s * b * h + logits


def loss_backward_transient_bytes(m: ModelSpec, seq_len: int, batch: int, *, tp: int = 1,
                                  value_bytes: int = 2, megatron: bool = False, fused: bool = False) -> float:
    """Bytes the loss's backward allocates for a moment on top of the kept fp32 logits
    (4 s b V / t). PyTorch's cross-entropy (log_softmax + nll_loss, torch and HF code): the
    gradient of the saved log-softmax output and the gradient of its input, both fp32, live
    while that output is (aten `_log_softmax_backward_data` allocates its result): 8 s b V / t.
    Megatron's vocab-parallel cross-entropy computes its gradient in the saved softmax
    buffer in place (megatron/core/tensor_parallel/cross_entropy.py, backward); only the
    cast back to the 16-bit logits' type allocates: 2 s b V / t (none in fp32). flash-attn's
    fused cross-entropy (not in place, as llm-foundry builds it) allocates the gradient of
    the 16-bit logits alone: 2 s b V / t."""
    elements = seq_len * batch * m.vocab / tp
    if fused:
        return value_bytes * elements
    if megatron:
        return 2.0 * elements if value_bytes < 4 else 0.0
    return 8.0 * elements


def inflight_microbatches(pp: int, grad_accum: int, stage: int = 0, virtual_stages: int = 1) -> int:
    """Micro-batches (model-chunk passes with interleaving) whose activations pipeline stage
    `stage` holds at once: under 1F1B min(pp - stage, m) (Narayanan et al., arXiv 2104.04473
    Sec. 2.2); under interleaved 1F1B with v chunks its warm-up forwards and one more,
    min(2 (pp - stage - 1) + (v - 1) pp + 1, m v), each of L / (pp v) layers
    (megatron/core/pipeline_parallel/schedules.py, sim.engines.policies.Interleaved)."""
    if virtual_stages == 1:
        return max(1, min(pp - stage, grad_accum))
    return max(1, min(2 * (pp - stage - 1) + (virtual_stages - 1) * pp + 1, grad_accum * virtual_stages))


def checkpoint_bytes(layers: int, seq_len: int, batch: int, hidden: int, *, tp: int = 1,
                     partitioned: bool = False) -> float:
    """Activation checkpoints, one 2 s b h input per layer (ZeRO paper Sec. 6.1, P_a).

    Without P_a each of the t model-parallel ranks keeps a full replica; with P_a each
    keeps 1/t. 100B example (L 125, h 8192, s 1024, b 32): 62.5 GiB, 3.9 GiB at t = 16.
    """
    total = 2.0 * layers * seq_len * batch * hidden
    return total / tp if partitioned else total


def pa_allgather_bytes_per_layer(seq_len: int, batch: int, hidden: int) -> float:
    """P_a: the full checkpoint of one layer re-assembled before its recompute (2 s b h)."""
    return 2.0 * seq_len * batch * hidden
