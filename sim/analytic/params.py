"""Parameter counts in closed form (reference/engines-and-costmodels.md 6.4).

These are the formulas; `sim.core.model.module_tree` builds the same model tensor by
tensor, and a test checks the two agree for every catalog model.
"""

from __future__ import annotations

from dataclasses import replace

from sim.core.model import Bias, ModelSpec, Norm, Position, module_tree


def attention_params(m: ModelSpec) -> int:
    """h*q + 2*h*kv + q*h, plus q + 2kv for qkv bias and + h for an output bias."""
    n = m.hidden * m.q_dim + 2 * m.hidden * m.kv_dim + m.q_dim * m.hidden
    if m.bias is not Bias.NONE:
        n += m.q_dim + 2 * m.kv_dim
    if m.bias is Bias.ALL:
        n += m.hidden
    return n


def expert_params(m: ModelSpec) -> int:
    """One MLP: 3*h*I gated (SwiGLU), 2*h*I plain, plus I + h biases for Bias.ALL."""
    n = (3 if m.gated_mlp else 2) * m.hidden * m.ffn_hidden
    if m.bias is Bias.ALL:
        n += m.ffn_hidden + m.hidden
    return n


def norm_params(m: ModelSpec) -> int:
    return m.hidden * (2 if m.norm is Norm.LAYERNORM else 1)


def mlp_params(m: ModelSpec) -> int:
    """Dense: one MLP. Mixtral: E experts + router h*E (arXiv 2401.04088)."""
    if m.experts > 1:
        return m.experts * expert_params(m) + m.hidden * m.experts
    return expert_params(m)


def layer_params(m: ModelSpec) -> int:
    """One transformer block: attention + MLP + two norms."""
    return attention_params(m) + mlp_params(m) + 2 * norm_params(m)


def embedding_params(m: ModelSpec) -> int:
    """Token embedding V*h, plus learned positions n_pos*h (GPT-2)."""
    n = m.vocab * m.hidden
    if m.position is Position.LEARNED:
        n += m.max_positions * m.hidden
    return n


def head_params(m: ModelSpec) -> int:
    """Final norm, plus the lm_head V*h unless tied to the embedding."""
    return norm_params(m) + (0 if m.tied_embeddings else m.vocab * m.hidden)


def total_params(m: ModelSpec) -> int:
    """P = embeddings + L * layer + final norm + untied head.

    Llama-2-7B 6,738,415,616; GPT-2 124,439,808; Mixtral-8x7B 46,702,792,704.
    """
    return embedding_params(m) + m.layers * layer_params(m) + head_params(m)


def active_params(m: ModelSpec) -> int:
    """Parameters a token touches: for MoE only top-k experts (Mixtral 12,879,925,248)."""
    idle = (m.experts - m.experts_per_token) * expert_params(m)
    return total_params(m) - m.layers * idle


def largest_module_params(m: ModelSpec) -> int:
    """The biggest single parameter-owning module (DeepSpeed's `largest_layer_params`).

    DeepSpeed's estimator (stage3.py `model_to_params`) takes the max over modules of
    the module's own (non-recursive) parameters; for LLMs that is the embedding or head.
    """
    return max(mod.numel for mod in module_tree(replace(m, layers=1)))   # every block is the same


def gpt_params_megatron(layers: int, hidden: int, vocab: int, seq_len: int) -> float:
    """Megatron SC21 Eq. 2: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)).

    Reproduces 174.6B for GPT-3 (l 96, h 12288, V 51200, s 2048); used to compare with
    papers, not for our own models (which count tensors exactly).
    """
    return 12 * layers * hidden**2 * (1 + 13 / (12 * hidden) + (vocab + seq_len) / (12 * layers * hidden))
