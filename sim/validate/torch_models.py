"""Small torch models for the validation runs, built to match sim.core.model.module_tree
(same module names, order and shapes), so the planner plans exactly what torch runs; and
the same sizes as Hugging Face's own LlamaForCausalLM (transformers imported lazily)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from sim.core.model import Family, ModelSpec


class RMSNorm(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding with the buffers of transformers' LlamaRotaryEmbedding
    (models/llama/modeling_llama.py, default rope, theta 10000): `inv_freq` and
    `original_inv_freq`, head_dim / 2 values each, not persistent (sim.core.model.module_buffers;
    DDP broadcasts them before a forward)."""

    inv_freq: torch.Tensor
    original_inv_freq: torch.Tensor

    def __init__(self, head_dim: int, theta: float = 10000.0) -> None:
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("original_inv_freq", inv_freq.clone(), persistent=False)

    def forward(self, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        angles = torch.outer(torch.arange(seq_len, dtype=self.inv_freq.dtype, device=self.inv_freq.device), self.inv_freq)
        emb = torch.cat((angles, angles), dim=-1)
        return emb.cos(), emb.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb: x cos + rotate_half(x) sin."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        self.m = m
        self.q_proj = nn.Linear(m.hidden, m.q_dim, bias=False)
        self.k_proj = nn.Linear(m.hidden, m.kv_dim, bias=False)
        self.v_proj = nn.Linear(m.hidden, m.kv_dim, bias=False)
        self.o_proj = nn.Linear(m.q_dim, m.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        m = self.m    # heads counted from the projections' width: a tensor-parallel rank holds 1/t of them
        q = apply_rotary(self.q_proj(x).view(b, s, -1, m.head_dim).transpose(1, 2), cos, sin)
        k = apply_rotary(self.k_proj(x).view(b, s, -1, m.head_dim).transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(b, s, -1, m.head_dim).transpose(1, 2)
        rep = m.heads // m.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class Mlp(nn.Module):
    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(m.hidden, m.ffn_hidden, bias=False)
        self.up_proj = nn.Linear(m.hidden, m.ffn_hidden, bias=False)
        self.down_proj = nn.Linear(m.ffn_hidden, m.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(m.hidden)
        self.self_attn = Attention(m)
        self.post_attention_layernorm = RMSNorm(m.hidden)
        self.mlp = Mlp(m)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(m.vocab, m.hidden)
        self.layers = nn.ModuleList(Block(m) for _ in range(m.layers))
        self.norm = RMSNorm(m.hidden)
        self.rotary_emb = RotaryEmbedding(m.head_dim)


class LlamaLike(nn.Module):
    """Parameter names as HF LlamaForCausalLM, in module_tree's order (HF registers a
    block's norms after its attention and MLP); buffers as HF's (rotary)."""

    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        if m.family is not Family.LLAMA or m.bias.value != "none" or m.tied_embeddings:
            raise ValueError("validation models are untied, bias-free llama-family models")
        self.model = Decoder(m)
        self.lm_head = nn.Linear(m.hidden, m.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.model.embed_tokens(tokens)
        cos, sin = self.model.rotary_emb(tokens.shape[1])
        for block in self.model.layers:
            x = block(x, cos, sin)
        return self.lm_head(self.model.norm(x))


def hf_llama(m: ModelSpec, seq_len: int) -> nn.Module:
    """transformers.LlamaForCausalLM with the sizes of `m`: untied, bias-free, fp32, SDPA
    attention, no KV cache; built offline from a LlamaConfig (no download), its weights
    drawn from torch's global generator (seed it first for identical ranks). Differences
    from LlamaLike that the recorded runs show: parameter order within a block (HF registers
    self_attn, mlp, then the two norms) and two rotary buffers, `model.rotary_emb.inv_freq`
    and `original_inv_freq` (non-persistent, but DDP broadcasts them)."""
    if m.family is not Family.LLAMA or m.bias.value != "none" or m.tied_embeddings:
        raise ValueError("validation models are untied, bias-free llama-family models")
    import transformers

    base: dict[str, Any] = {"attn_implementation": "sdpa"}   # a PretrainedConfig keyword, not LlamaConfig's
    config = transformers.LlamaConfig(
        vocab_size=m.vocab, hidden_size=m.hidden, intermediate_size=m.ffn_hidden, num_hidden_layers=m.layers,
        num_attention_heads=m.heads, num_key_value_heads=m.kv_heads, head_dim=m.head_dim,
        max_position_embeddings=max(2048, seq_len), rms_norm_eps=1e-6, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False, use_cache=False, **base)
    return transformers.LlamaForCausalLM(config).float()


def lecture_mlp() -> nn.Sequential:
    """The lecture's 281,864-parameter MLP (reference/000 Sec. 3.2): 64 -> 256 -> 4 x (256 ->
    256) -> 8 with ReLU. Its sizes give ZeroRedundancyOptimizer's greedy split 1.16 x."""
    layers: list[nn.Module] = [nn.Linear(64, 256), nn.ReLU()]
    for _ in range(4):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    layers.append(nn.Linear(256, 8))
    return nn.Sequential(*layers)
