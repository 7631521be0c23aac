"""Small torch models for the validation runs, built to match sim.model.module_tree
(same module names, order and shapes), so the planner plans exactly what torch runs."""

from __future__ import annotations

import torch
from torch import nn

from sim.model import Family, ModelSpec


class RMSNorm(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class Attention(nn.Module):
    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        self.m = m
        self.q_proj = nn.Linear(m.hidden, m.q_dim, bias=False)
        self.k_proj = nn.Linear(m.hidden, m.kv_dim, bias=False)
        self.v_proj = nn.Linear(m.hidden, m.kv_dim, bias=False)
        self.o_proj = nn.Linear(m.q_dim, m.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        m = self.m
        q = self.q_proj(x).view(b, s, m.heads, m.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, m.kv_heads, m.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, m.kv_heads, m.head_dim).transpose(1, 2)
        rep = m.heads // m.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, m.q_dim))


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(m.vocab, m.hidden)
        self.layers = nn.ModuleList(Block(m) for _ in range(m.layers))
        self.norm = RMSNorm(m.hidden)


class LlamaLike(nn.Module):
    """Parameter names and order as HF LlamaForCausalLM (and module_tree)."""

    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        if m.family is not Family.LLAMA or m.bias.value != "none" or m.tied_embeddings:
            raise ValueError("validation models are untied, bias-free llama-family models")
        self.model = Decoder(m)
        self.lm_head = nn.Linear(m.hidden, m.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.model.embed_tokens(tokens)
        for block in self.model.layers:
            x = block(x)
        return self.lm_head(self.model.norm(x))


def lecture_mlp() -> nn.Sequential:
    """The lecture's 281,864-parameter MLP (reference/000 Sec. 3.2): 64 -> 256 -> 4 x (256 ->
    256) -> 8 with ReLU. Its sizes give ZeroRedundancyOptimizer's greedy split 1.16 x."""
    layers: list[nn.Module] = [nn.Linear(64, 256), nn.ReLU()]
    for _ in range(4):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    layers.append(nn.Linear(256, 8))
    return nn.Sequential(*layers)
