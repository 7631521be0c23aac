"""Model architecture spec and its module tree (which tensor belongs to which module).

`ModelSpec` is data only. `module_tree()` expands it into the modules a framework
would build, in forward order, each with its parameter tensors and shapes, named as
in Hugging Face transformers. The planner needs this: a DeepSpeed ZeRO-3 fetch unit
is a module that owns parameters (each Linear, Embedding, norm), an FSDP2 unit is a
transformer block, and both pad per tensor (reference/engines-and-costmodels.md 6.4).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from enum import StrEnum


class Family(StrEnum):
    """Module layout. llama: q/k/v/o + gate/up/down (Llama, Mistral, Qwen2);
    gpt2: fused c_attn + c_fc/c_proj (GPT-2, GPT-3, Turing-NLG); mixtral: llama
    attention + block_sparse_moe (router `gate` + experts w1/w2/w3)."""

    LLAMA = "llama"
    GPT2 = "gpt2"
    MIXTRAL = "mixtral"


class Norm(StrEnum):
    RMSNORM = "rmsnorm"      # weight only
    LAYERNORM = "layernorm"  # weight and bias


class Bias(StrEnum):
    NONE = "none"  # Llama, Mistral
    QKV = "qkv"    # Qwen2: bias on q, k, v only
    ALL = "all"    # GPT-2: every Linear has a bias


class Position(StrEnum):
    ROPE = "rope"        # no parameters
    LEARNED = "learned"  # an Embedding of max_positions x hidden


@dataclass(frozen=True, slots=True)
class LoraSpec:
    """PEFT's LoraConfig as simulated (peft/tuners/lora/config.py): rank-`rank` adapters on
    the Linears inside the blocks that `targets` names. A target matches a module whose
    name is the target or ends with "." + target (peft/tuners/tuners_utils.py
    `check_target_module_exists`); "all-linear" matches every Linear of the blocks; a
    `pattern` (target_modules given as one string) must match the whole module name."""

    rank: int
    targets: tuple[str, ...]
    pattern: str | None = None

    def targets_module(self, name: str) -> bool:
        if self.pattern is not None:
            return re.fullmatch(self.pattern, name) is not None
        return self.targets == ("all-linear",) or any(name == t or name.endswith("." + t) for t in self.targets)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer, as its HF config.json describes it; `lora`: fine-tuned
    with LoRA adapters (the base frozen)."""

    name: str
    family: Family
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn_hidden: int
    vocab: int
    gated_mlp: bool
    tied_embeddings: bool
    norm: Norm
    bias: Bias
    position: Position
    max_positions: int       # only counted when position is LEARNED
    experts: int = 1         # MoE: experts per layer (1 = dense)
    experts_per_token: int = 1
    lora: LoraSpec | None = None

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One parameter tensor; `trainable` false for a frozen one (no gradient, no optimizer state)."""

    name: str
    shape: tuple[int, ...]
    trainable: bool = True

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class Role(StrEnum):
    """What a module is in the model, from its place in the structure (never from its name)."""

    TOKEN_EMBEDDING = "token embedding"
    POSITION_EMBEDDING = "position embedding"
    BLOCK = "block"              # inside a transformer block
    FINAL_NORM = "final norm"
    HEAD = "head"                # the lm_head (or the tied head that reuses the embedding)


class Place(StrEnum):
    """Where a Linear sits in its block, from the structure: which kernels come around it
    (an activation before the MLP's output projection, a residual add after it and after
    the attention's) and how tensor parallelism splits it (Megatron: column-parallel in,
    row-parallel out)."""

    QKV = "qkv"              # attention input projections (column-parallel)
    ATTN_OUT = "attn out"    # attention output projection (row-parallel)
    FFN_IN = "ffn in"        # MLP input projections: up, gate, c_fc, w1, w3 (column-parallel)
    FFN_OUT = "ffn out"      # MLP output projection: down, c_proj, w2 (row-parallel)
    ROUTER = "router"        # MoE gate (replicated)
    OTHER = "other"          # embeddings, norms, the head


@dataclass(frozen=True, slots=True)
class ModuleSpec:
    """A module that directly owns parameters (a DeepSpeed ZeRO-3 fetch unit).

    `block` is the transformer layer index, or None for embeddings, final norm and head.
    `expert` is the expert index inside an MoE layer, else None. `container` is the
    attention, MLP or MoE module that holds it inside its block ("" for a block's norms and
    for modules outside the blocks); `feeds_attention` marks the projection whose output
    the attention core reads last (v_proj, GPT-2's fused c_attn).
    """

    name: str
    kind: str          # 'embedding' | 'linear' | 'norm'
    block: int | None
    tensors: tuple[TensorSpec, ...]
    expert: int | None = None
    role: Role = Role.BLOCK
    container: str = ""
    feeds_attention: bool = False
    place: Place = Place.OTHER
    conv1d: bool = False     # weight stored (in, out), HF GPT-2's Conv1D; nn.Linear is (out, in)
    wrapper: str = ""        # PEFT's lora.Linear that holds it (base_layer, lora_A, lora_B), or ""
    lora: str = ""           # "A" or "B" for an adapter, else ""

    @property
    def numel(self) -> int:
        return sum(t.numel for t in self.tensors)

    @property
    def trainable(self) -> bool:
        return any(t.trainable for t in self.tensors)


def module_tree(m: ModelSpec) -> list[ModuleSpec]:
    """Every parameter-owning module in forward order (the lm_head last)."""
    mods = [_embedding("model.embed_tokens", m.vocab, m.hidden, Role.TOKEN_EMBEDDING)]
    if m.position is Position.LEARNED:
        mods.append(_embedding("model.embed_positions", m.max_positions, m.hidden, Role.POSITION_EMBEDDING))
    for i in range(m.layers):
        mods += _block(m, i)
    mods.append(replace(_norm("model.norm", m, None), role=Role.FINAL_NORM))
    if not m.tied_embeddings:
        mods.append(replace(_linear("lm_head", m.vocab, m.hidden, bias=False, block=None), role=Role.HEAD))
    return _with_lora(mods, m.lora) if m.lora else mods


def _with_lora(mods: list[ModuleSpec], lora: LoraSpec) -> list[ModuleSpec]:
    """PEFT's model: every parameter frozen; each targeted Linear becomes a lora.Linear
    holding the frozen `base_layer` and two trainable Linears without bias, `lora_A.default`
    (in -> r) and `lora_B.default` (r -> out), run in that order (peft/tuners/lora/layer.py
    `Linear.forward`: base, then B(A(dropout(x))) x scaling added)."""
    out = []
    for mod in mods:
        frozen = replace(mod, tensors=tuple(replace(t, trainable=False) for t in mod.tensors))
        if mod.kind != "linear" or mod.block is None or not lora.targets_module(mod.name):
            out.append(frozen)
            continue
        w = mod.tensors[0].shape
        out_features, in_features = (w[1], w[0]) if mod.conv1d else (w[0], w[1])
        base = f"{mod.name}.base_layer"
        out.append(replace(frozen, name=base, feeds_attention=False, wrapper=mod.name,
                           tensors=tuple(replace(t, name=t.name.replace(mod.name, base, 1)) for t in frozen.tensors)))
        for half, shape in (("A", (lora.rank, in_features)), ("B", (out_features, lora.rank))):
            name = f"{mod.name}.lora_{half}.default"
            out.append(ModuleSpec(name, "linear", mod.block, (TensorSpec(f"{name}.weight", shape),), mod.expert,
                                  container=mod.container, feeds_attention=mod.feeds_attention and half == "B",
                                  place=Place.OTHER, wrapper=mod.name, lora=half))
    return out


def _block(m: ModelSpec, i: int) -> list[ModuleSpec]:
    p = f"model.layers.{i}"
    every = m.bias is Bias.ALL
    mods = [_norm(f"{p}.input_layernorm", m, i)]
    if m.family is Family.GPT2:
        attn = f"{p}.attn"
        mods.append(replace(_linear(f"{attn}.c_attn", m.q_dim + 2 * m.kv_dim, m.hidden, every, i, conv1d=True),
                            container=attn, feeds_attention=True, place=Place.QKV))
        mods.append(replace(_linear(f"{attn}.c_proj", m.hidden, m.q_dim, every, i, conv1d=True), container=attn,
                            place=Place.ATTN_OUT))
    else:
        attn = f"{p}.self_attn"
        qkv_bias = m.bias is not Bias.NONE
        for proj, out in (("q_proj", m.q_dim), ("k_proj", m.kv_dim), ("v_proj", m.kv_dim)):
            mods.append(replace(_linear(f"{attn}.{proj}", out, m.hidden, qkv_bias, i), container=attn,
                                feeds_attention=proj == "v_proj", place=Place.QKV))
        mods.append(replace(_linear(f"{attn}.o_proj", m.hidden, m.q_dim, every, i), container=attn,
                            place=Place.ATTN_OUT))
    mods.append(_norm(f"{p}.post_attention_layernorm", m, i))
    if m.experts > 1:
        moe = f"{p}.block_sparse_moe"
        mods.append(replace(_linear(f"{moe}.gate", m.experts, m.hidden, False, i), container=moe,
                            place=Place.ROUTER))
        for e in range(m.experts):
            mods += [replace(mod, container=moe) for mod in _mlp(m, f"{moe}.experts.{e}", i, e)]
    else:
        mods += [replace(mod, container=f"{p}.mlp") for mod in _mlp(m, f"{p}.mlp", i, None)]
    return mods


def _mlp(m: ModelSpec, p: str, i: int, expert: int | None) -> list[ModuleSpec]:
    every = m.bias is Bias.ALL
    h, f = m.hidden, m.ffn_hidden
    if m.family is Family.MIXTRAL:
        names = [("w1", f, h), ("w3", f, h), ("w2", h, f)]
    elif m.family is Family.GPT2:
        names = [("c_fc", f, h), ("c_proj", h, f)]
    elif m.gated_mlp:
        names = [("gate_proj", f, h), ("up_proj", f, h), ("down_proj", h, f)]
    else:
        names = [("up_proj", f, h), ("down_proj", h, f)]
    conv1d = m.family is Family.GPT2
    last = len(names) - 1
    return [replace(_linear(f"{p}.{n}", out, inp, every, i, expert, conv1d),
                    place=Place.FFN_OUT if j == last else Place.FFN_IN)
            for j, (n, out, inp) in enumerate(names)]


def _embedding(name: str, rows: int, hidden: int, role: Role) -> ModuleSpec:
    return ModuleSpec(name, "embedding", None, (TensorSpec(f"{name}.weight", (rows, hidden)),), role=role)


def _linear(name: str, out: int, inp: int, bias: bool, block: int | None,
            expert: int | None = None, conv1d: bool = False) -> ModuleSpec:
    """nn.Linear stores weight as (out, in); HF GPT-2's Conv1D stores it as (in, out)."""
    tensors = [TensorSpec(f"{name}.weight", (inp, out) if conv1d else (out, inp))]
    if bias:
        tensors.append(TensorSpec(f"{name}.bias", (out,)))
    return ModuleSpec(name, "linear", block, tuple(tensors), expert, conv1d=conv1d)


def _norm(name: str, m: ModelSpec, block: int | None) -> ModuleSpec:
    tensors = [TensorSpec(f"{name}.weight", (m.hidden,))]
    if m.norm is Norm.LAYERNORM:
        tensors.append(TensorSpec(f"{name}.bias", (m.hidden,)))
    return ModuleSpec(name, "norm", block, tuple(tensors))


@dataclass(frozen=True, slots=True)
class BufferSpec:
    """A module buffer (state that is not a parameter): no gradient, no optimizer state,
    but broadcast by DDP (`broadcast_buffers`) and held on every rank."""

    name: str
    numel: int
    element_bytes: int


def module_buffers(m: ModelSpec) -> tuple[BufferSpec, ...]:
    """The buffers transformers (5.x) registers, per architecture. Rotary models (llama,
    mistral, qwen2, mixtral: models/llama/modeling_llama.py `LlamaRotaryEmbedding`) hold
    `inv_freq` and `original_inv_freq`, head_dim / 2 fp32 values each, once per model
    (`model.rotary_emb`); GPT-2 (learned positions) holds none. Older transformers
    releases differ (4.x GPT-2 kept a causal-mask buffer per layer): we follow 5.x."""
    if m.position is not Position.ROPE:
        return ()
    half = m.head_dim // 2
    return (BufferSpec("model.rotary_emb.inv_freq", half, 4),
            BufferSpec("model.rotary_emb.original_inv_freq", half, 4))
