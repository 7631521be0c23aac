"""What one micro-batch costs, module by module: the planner's raw material.

`units()` expands a model into its parameter-owning modules in forward order (a DeepSpeed
ZeRO-3 fetch unit each) plus the attention core, with FLOPs (reference 6.5: a Linear
costs 2 T in out forward, as much again for the input gradient and for the weight
gradient) and HBM traffic, per tensor-parallel rank. `blocks()` merges them per
transformer block (the DDP / ZeRO-1/2 / FSDP2 granularity).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from sim.core.model import Family, ModelSpec, Position, Role, module_tree


@dataclass(frozen=True, slots=True)
class Unit:
    """A module (or a merged group of modules) as the planner sees it, per TP rank."""

    name: str
    block: int | None                 # transformer block; None for embeddings and head
    tensors: tuple[int, ...]          # numel of each parameter tensor it owns (per TP rank)
    fwd_flops: float
    bwd_input_flops: float
    bwd_weight_flops: float
    fwd_bytes: float                  # HBM traffic forward
    bwd_bytes: float                  # HBM traffic backward
    attention_flops: float = 0.0      # forward FLOPs that selective recompute runs again
    shares: str | None = None         # a tied head uses the embedding's parameters
    role: Role = Role.BLOCK           # what it is in the model (sim.core.model.Role)
    containers: tuple[str, ...] = ("root",)   # the modules with children that enclose it,
                                              # outermost first (DeepSpeed hooks them too)

    @property
    def numel(self) -> int:
        return sum(self.tensors)


@lru_cache(maxsize=16)
def units(m: ModelSpec, seq_len: int, micro_batch: int, tp: int = 1, value_bytes: int = 2) -> tuple[Unit, ...]:
    """Parameter-owning modules in forward order, plus one attention-core unit per block;
    `value_bytes` is the size of an activation / weight value (2 in mixed precision).
    Cached: every pipeline stage's planner asks for the same units."""
    tokens = seq_len * micro_batch
    out: list[Unit] = []
    for mod in module_tree(m):
        shards = tuple(_tp_numel(t.shape, mod.kind, tp) for t in mod.tensors)
        where = _containers(mod.block, mod.container)
        if mod.kind == "embedding":
            traffic = value_bytes * tokens * m.hidden
            out.append(Unit(mod.name, None, shards, 0.0, 0.0, 0.0, traffic, 2 * traffic, role=mod.role,
                            containers=where))
        elif mod.kind == "norm":
            traffic = 2 * value_bytes * tokens * m.hidden
            out.append(Unit(mod.name, mod.block, shards, 0.0, 0.0, 0.0, traffic, 2 * traffic, role=mod.role,
                            containers=where))
        else:
            out.append(_linear_unit(m, mod.name, mod.block, shards, mod.tensors[0].shape, tokens, tp,
                                    routed=mod.expert is not None, value_bytes=value_bytes, role=mod.role,
                                    containers=where))
        if mod.feeds_attention:
            out.append(_attention_core(m, mod.block, seq_len, micro_batch, tp, value_bytes, where))
    if m.tied_embeddings:
        out.append(_linear_unit(m, "lm_head (tied)", None, (), (m.vocab, m.hidden), tokens, tp, routed=False,
                                value_bytes=value_bytes, role=Role.HEAD, shares="model.embed_tokens"))
    return tuple(out)


def _containers(block: int | None, container: str) -> tuple[str, ...]:
    """The root, the block, and the attention / MLP / MoE module, as far as they enclose."""
    if block is None:
        return ("root",)
    here = f"model.layers.{block}"
    return ("root", here, container) if container else ("root", here)


def _tp_numel(shape: tuple[int, ...], kind: str, tp: int) -> int:
    """Linear and embedding weights split t ways (Megatron); norms replicated."""
    numel = 1
    for d in shape:
        numel *= d
    return numel if kind == "norm" or tp == 1 else -(-numel // tp)


def _linear_unit(m: ModelSpec, name: str, block: int | None, shards: tuple[int, ...],
                 shape: tuple[int, ...], tokens: int, tp: int, routed: bool, value_bytes: int = 2,
                 role: Role = Role.BLOCK, containers: tuple[str, ...] = ("root",), shares: str | None = None) -> Unit:
    """2 T in out per pass; routed experts see T k / E tokens (balanced routing)."""
    inp, out = (shape[1], shape[0]) if len(shape) == 2 else (shape[0], 1)
    routed_tokens = tokens * m.experts_per_token / m.experts if routed else float(tokens)
    gemm = 2.0 * routed_tokens * inp * out / tp
    traffic = value_bytes * (inp * out + routed_tokens * (inp + out)) / tp
    if role is Role.HEAD:
        traffic += 4.0 * tokens * m.vocab / tp  # fp32 logits for the loss
    return Unit(name, block, shards, gemm, gemm, gemm, traffic, 2 * traffic, shares=shares, role=role,
                containers=containers)


def _attention_core(m: ModelSpec, block: int | None, seq_len: int, micro_batch: int, tp: int,
                    value_bytes: int, containers: tuple[str, ...]) -> Unit:
    """QK^T and AV: 4 s^2 a d b forward; a causal kernel computes about half of it.

    Hardware time uses the causal half; model FLOPs (sim.analytic.compute) count the
    full matrix, as PaLM and Megatron do.
    """
    flops = 0.5 * 4.0 * seq_len**2 * m.heads * m.head_dim * micro_batch / tp
    traffic = value_bytes * 4 * seq_len * micro_batch * m.q_dim / tp
    return Unit(f"model.layers.{block}.attention", block, (), flops, 2 * flops, 0.0, traffic,
                2 * traffic, attention_flops=flops, containers=containers)


def unit_count(m: ModelSpec, *, per_module: bool) -> int:
    """len(units(m, ...)) (per_module) or len(blocks(units(m, ...))), in closed form, so that
    the engine's work can be estimated without building anything (sim.core.limits)."""
    if not per_module:
        return m.layers + 2                        # embedding, one per block, head
    attention = 2 if m.family is Family.GPT2 else 4
    if m.experts > 1:
        mlp = 1 + 3 * m.experts                    # router + w1, w3, w2 per expert
    else:
        mlp = 3 if m.gated_mlp and m.family is not Family.GPT2 else 2
    per_block = 2 + attention + 1 + mlp            # two norms, projections, attention core
    outside = 3 + (m.position is Position.LEARNED)  # embeddings, final norm, head
    return outside + m.layers * per_block


def merge(group: list[Unit], name: str, role: Role) -> Unit:
    """Sum a list of units into one (a block, or FSDP2's root group)."""
    return Unit(name, group[0].block, tuple(t for u in group for t in u.tensors),
                sum(u.fwd_flops for u in group), sum(u.bwd_input_flops for u in group),
                sum(u.bwd_weight_flops for u in group), sum(u.fwd_bytes for u in group),
                sum(u.bwd_bytes for u in group), sum(u.attention_flops for u in group), role=role,
                containers=group[0].containers[:2])


EMBEDDINGS = (Role.TOKEN_EMBEDDING, Role.POSITION_EMBEDDING)


def blocks(all_units: Sequence[Unit]) -> list[Unit]:
    """Embedding unit(s), one unit per transformer block, then the head (norm + lm_head).
    The merged embedding unit takes the token embedding's role (it is vocab-parallel)."""
    pre = [u for u in all_units if u.role in EMBEDDINGS]
    post = [u for u in all_units if u.block is None and u.role not in EMBEDDINGS]
    by_block: dict[int, list[Unit]] = {}
    for u in all_units:
        if u.block is not None:
            by_block.setdefault(u.block, []).append(u)
    merged = [merge(pre, "embedding", Role.TOKEN_EMBEDDING)]
    merged += [merge(v, f"model.layers.{k}", Role.BLOCK) for k, v in sorted(by_block.items())]
    return merged + [merge(post, "head", Role.HEAD)]
