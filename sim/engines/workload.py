"""What one micro-batch costs, module by module: the planner's raw material.

`units()` expands a model into its parameter-owning modules in forward order (a DeepSpeed
ZeRO-3 fetch unit each) plus the attention core, each with the device kernels of its
forward and backward per tensor-parallel rank (sim.analytic.kernels: GEMMs, attention,
and the memory-bound kernels around them, as the scenario's `[compute]` implementation
fuses them). `blocks()` merges them per transformer block (the DDP / ZeRO-1/2 / FSDP2
granularity).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING

from sim.analytic import kernels as kn
from sim.analytic import op_sac
from sim.analytic.kernels import AttentionImpl, Kernel, KernelStyle, Passes
from sim.core.enums import Engine, Float8Recipe, LossImpl
from sim.core.model import Family, ModelSpec, ModuleSpec, Norm, Place, Position, Role, module_tree
from sim.core.units import BYTES_PER_ELEMENT

if TYPE_CHECKING:
    from sim.inputs.scenario import Scenario


@dataclass(frozen=True, slots=True)
class Unit:
    """A module (or a merged group of modules) as the planner sees it, per TP rank."""

    name: str
    block: int | None                 # transformer block; None for embeddings and head
    tensors: tuple[int, ...]          # numel of each parameter tensor it owns (per TP rank)
    passes: Passes                    # its kernels: forward, input gradient, weight gradient
    selective: tuple[Kernel, ...] = ()  # forward kernels selective recompute runs again
    op_recompute: tuple[Kernel, ...] = ()  # forward kernels torchtitan's per-op selective AC runs again
    shares: str | None = None         # a tied head uses the embedding's parameters
    role: Role = Role.BLOCK           # what it is in the model (sim.core.model.Role)
    containers: tuple[str, ...] = ("root",)   # the modules with children that enclose it,
                                              # outermost first (DeepSpeed hooks them too)
    trainable: tuple[bool, ...] | None = None  # per tensor; None: all of them (no LoRA)
    ndims: tuple[int, ...] = ()       # per tensor: its number of dimensions (1: norms and biases)

    @property
    def numel(self) -> int:
        return sum(self.tensors)

    @property
    def grad_tensors(self) -> tuple[int, ...]:
        """The numel of each tensor that gets a gradient (all but LoRA's frozen base)."""
        if self.trainable is None:
            return self.tensors
        return tuple(n for n, keep in zip(self.tensors, self.trainable, strict=True) if keep)

    @property
    def grad_shapes(self) -> tuple[tuple[int, int], ...]:
        """(numel, dimensions) of each tensor that gets a gradient (dimensions 2 where unknown)."""
        ndims = self.ndims or (2,) * len(self.tensors)
        keep = self.trainable or (True,) * len(self.tensors)
        return tuple((n, d) for n, d, k in zip(self.tensors, ndims, keep, strict=True) if k)

    @property
    def grad_numel(self) -> int:
        return sum(self.grad_tensors)


@dataclass(frozen=True, slots=True)
class Shape:
    """What the kernels of one micro-batch depend on besides the model."""

    seq_len: int
    micro_batch: int
    tp: int = 1
    value_bytes: int = 2
    style: KernelStyle = KernelStyle.TORCH
    attention: AttentionImpl = AttentionImpl.FLASH
    sequence_parallel: bool = False
    float8: bool = False              # the blocks' Linears as torchao Float8Linear (sim.analytic.kernels)
    float8_tp: bool = False           # torchao's float8 TP styles: fp8 casts on the sequence shard (float8_tp)
    fused_loss: bool = False          # flash-attn's fused cross-entropy ([compute] cross_entropy = "fused")

    @property
    def float8_cast_share(self) -> float:
        """The share of a TP-split activation each rank casts to fp8 itself: its sequence
        shard under float8 TP, else all of it."""
        return 1 / self.tp if self.float8_tp else 1.0

    @property
    def tokens(self) -> int:
        return self.seq_len * self.micro_batch

    @property
    def local_tokens(self) -> int:
        """Tokens a rank holds outside the TP regions (all of them, or 1/tp with sequence
        parallelism: Korthikanti et al. Sec. 4.2.2)."""
        return -(-self.tokens // self.tp) if self.sequence_parallel else self.tokens


# Linears that read the same input as the one before them (q_proj's; gate_proj's where the
# MLP is gated): under torch.compile their Float8 input casts are one computation
# (sim.analytic.kernels.float8_linear).
SHARED_INPUT_LINEARS = ("k_proj", "v_proj", "up_proj")


def shape_of(s: Scenario, tp: int) -> Shape:
    """The Shape of a scenario's micro-batch on a TP group of `tp` ranks."""
    t, c = s.training, s.compute
    return Shape(t.seq_len, t.micro_batch, tp, BYTES_PER_ELEMENT[t.precision.value], c.kernels, c.attention,
                 s.parallel.sequence_parallel, c.float8 is not Float8Recipe.NONE, tp > 1 and float8_tp(s),
                 c.cross_entropy is LossImpl.FUSED)


def float8_tp(s: Scenario) -> bool:
    """torchtitan with Float8 linears and sequence-parallel TP applies torchao's float8 TP
    styles (torchao/float8/float8_tensor_parallel.py: Float8ColwiseParallel,
    Float8RowwiseParallel, PrepareFloat8ModuleInput): the input of the attention and of the
    MLP is cast to fp8 on its sequence shard and all-gathered in fp8, and the gradient of
    each row-parallel output is cast to fp8 on its shard before its backward all-gather;
    the reduce-scatters (forward outputs, backward input gradients) stay bf16. Only DTensor
    TP does this, so the torch engines; the embedding and the output head are not Float8."""
    return s.compute.float8 is not Float8Recipe.NONE and s.parallel.sequence_parallel \
        and s.engine in (Engine.FSDP2, Engine.DDP)


@lru_cache(maxsize=16)
def units(m: ModelSpec, shape: Shape) -> tuple[Unit, ...]:
    """Parameter-owning modules in forward order, plus one attention-core unit per block.
    Cached: every pipeline stage's planner asks for the same units."""
    out: list[Unit] = []
    made: dict[tuple[object, ...], Passes] = {}      # identical blocks share their kernel objects
    core: tuple[Passes, tuple[Kernel, ...]] | None = None
    saved = [mm.saved for mm in op_sac.block_matmuls(m, shape.tp)] if m.experts == 1 and m.lora is None else []
    matmul = 0                                       # the Linear's place in its block's call order
    for mod in module_tree(m):
        shards = tuple(_tp_numel(t.shape, mod.kind, shape.tp) for t in mod.tensors)
        where = _containers(mod.block, mod.container) + ((mod.wrapper,) if mod.wrapper else ())
        name = _in_block(mod.name, mod.block)
        key = (name, mod.kind, mod.place, mod.role, mod.expert, tuple(t.shape for t in mod.tensors), mod.trainable)
        if key not in made:
            made[key] = _module_passes(m, replace(mod, name=name), shape)
        trainable = tuple(t.trainable for t in mod.tensors) if m.lora else None
        keep_gemm = False
        if mod.block is not None and mod.kind == "linear" and saved:
            keep_gemm, matmul = saved[matmul % len(saved)], matmul + 1
        out.append(Unit(mod.name, mod.block, shards, made[key], role=mod.role, containers=where, trainable=trainable,
                        ndims=tuple(len(t.shape) for t in mod.tensors),
                        op_recompute=_op_recompute(made[key], keep_gemm) if mod.block is not None else ()))
        if mod.feeds_attention:
            if core is None:
                core = _attention_core(m, shape)
            out.append(Unit(f"model.layers.{mod.block}.attention", mod.block, (), core[0], selective=core[1],
                            containers=where, op_recompute=_op_recompute(core[0], True)))
    if m.tied_embeddings:
        head = kn.linear("lm_head (tied)", shape.tokens, -(-m.vocab // shape.tp), m.hidden, bias=False,
                         value_bytes=shape.value_bytes)
        loss = kn.cross_entropy("loss", shape.tokens, -(-m.vocab // shape.tp), shape.style, shape.value_bytes,
                                shape.fused_loss)
        out.append(Unit("lm_head (tied)", None, (), chain(head, loss), role=Role.HEAD, shares="model.embed_tokens"))
    return tuple(out)


def _op_recompute(passes: Passes, keep_gemm: bool) -> tuple[Kernel, ...]:
    """The forward kernels of a block module that torchtitan's per-op policy runs again
    (sim.analytic.op_sac): the memory-bound ones always, its GEMM unless the policy saved
    it; never the fused attention kernel."""
    return tuple(k for k in passes.forward
                 if k.kind is kn.KernelKind.MEMORY or (k.kind is kn.KernelKind.GEMM and not keep_gemm))


def chain(*parts: Passes) -> Passes:
    """Kernels run one module part after another: forward in order, the input gradient in
    reverse (autograd walks back), weight gradients as they come."""
    return Passes(tuple(k for p in parts for k in p.forward),
                  tuple(k for p in reversed(parts) for k in p.backward_input),
                  tuple(k for p in reversed(parts) for k in p.backward_weight))


def _module_passes(m: ModelSpec, mod: ModuleSpec, shape: Shape) -> Passes:
    """A module's kernels; a frozen one (LoRA's base) computes no weight gradient, and a
    frozen embedding no backward at all (nothing before it needs a gradient)."""
    passes = _trainable_passes(m, mod, shape)
    if mod.trainable:
        return passes
    if mod.kind == "embedding":
        return Passes(passes.forward)
    return Passes(passes.forward, passes.backward_input)


def _trainable_passes(m: ModelSpec, mod: ModuleSpec, shape: Shape) -> Passes:
    v, tp, style = shape.value_bytes, shape.tp, shape.style
    if mod.lora:
        return _adapter_passes(m, mod, shape)
    if mod.kind == "embedding":
        rows = mod.tensors[0].shape[0]
        passes = kn.embedding(mod.name, shape.tokens, m.hidden, -(-rows // tp), v)
        if mod.role is Role.POSITION_EMBEDDING:     # added to the token embedding
            passes = chain(passes, kn.residual(f"{mod.name} add", shape.tokens * m.hidden, style, False, v))
        return passes
    if mod.kind == "norm":
        return kn.norm(mod.name, shape.local_tokens * m.hidden, style, m.norm is Norm.RMSNORM, v)
    return _linear_passes(m, mod, shape)


def _linear_passes(m: ModelSpec, mod: ModuleSpec, shape: Shape) -> Passes:
    """A Linear split the Megatron way (column-parallel in, row-parallel out, vocab-parallel
    head, replicated router), with the kernels that come around it: the activation before
    the MLP's output projection, the residual (dropout-)add after each branch, the loss
    after the head. Routed experts see T k / E tokens (balanced routing)."""
    v, tp, style = shape.value_bytes, shape.tp, shape.style
    w = mod.tensors[0].shape
    out_features, in_features = (w[1], w[0]) if mod.conv1d else (w[0], w[1])
    tokens = shape.tokens
    if mod.expert is not None:
        tokens = -(-tokens * m.experts_per_token // m.experts)
    bias = len(mod.tensors) > 1
    dropout = m.family is Family.GPT2
    f8 = shape.float8         # torchtitan converts every Linear but the output head (float8.filter_fqns)
    if mod.place in (Place.QKV, Place.FFN_IN):
        leaf = mod.name.rsplit(".", 1)[-1]
        shared = shape.style is KernelStyle.TORCH_COMPILE and leaf in SHARED_INPUT_LINEARS \
            and (leaf != "up_proj" or m.gated_mlp)
        return kn.linear(mod.name, tokens, -(-out_features // tp), in_features, bias=bias, value_bytes=v, float8=f8,
                         cast_input=not shared, input_share=shape.float8_cast_share)
    if mod.place is Place.ROUTER:
        return kn.linear(mod.name, tokens, out_features, in_features, bias=bias, value_bytes=v)
    if mod.place in (Place.ATTN_OUT, Place.FFN_OUT):
        gemm = kn.linear(mod.name, tokens, out_features, -(-in_features // tp), bias=bias, value_bytes=v, float8=f8,
                         grad_share=shape.float8_cast_share)
        parts = [gemm]
        if mod.place is Place.FFN_OUT:
            act = kn.activation(mod.name, tokens * -(-in_features // tp), style, m.gated_mlp,
                                m.family is Family.GPT2, v)
            parts = [act, gemm]
        last_expert = mod.expert is None or mod.expert == m.experts - 1
        if last_expert:
            parts.append(kn.residual(mod.name, shape.local_tokens * m.hidden, style, dropout, v))
        return chain(*parts)
    head = kn.linear(mod.name, tokens, -(-out_features // tp), in_features, bias=bias, value_bytes=v)
    return chain(head, kn.cross_entropy("loss", tokens, -(-out_features // tp), style, v, shape.fused_loss))


def _adapter_passes(m: ModelSpec, mod: ModuleSpec, shape: Shape) -> Passes:
    """A LoRA adapter Linear without bias (peft/tuners/lora/layer.py): lora_A (in -> r) adds
    its input gradient to the base layer's (one add over the input); lora_B (r -> out) is
    scaled and added to the base output (a multiply and an add; the multiply's gradient in
    backward). Dropout on the adapter input costs nothing here (see docs/scenarios.md). An
    expert's adapters see its T k / E tokens, as the expert does."""
    v, tokens = shape.value_bytes, shape.tokens
    if mod.expert is not None:
        tokens = -(-tokens * m.experts_per_token // m.experts)
    out_features, in_features = mod.tensors[0].shape
    gemm = kn.linear(mod.name, tokens, out_features, in_features, bias=False, value_bytes=v)
    if mod.lora == "A":
        return Passes(gemm.forward, gemm.backward_input + (kn.memory(f"{mod.name} dX add", 3 * v * tokens * in_features),),
                      gemm.backward_weight)
    scale = kn.Passes((kn.memory(f"{mod.name} scale", 2 * v * tokens * out_features),
                       kn.memory(f"{mod.name} add", 3 * v * tokens * out_features)),
                      (kn.memory(f"{mod.name} scale dX", 2 * v * tokens * out_features),))
    return chain(gemm, scale)


def _attention_core(m: ModelSpec, shape: Shape) -> tuple[Passes, tuple[Kernel, ...]]:
    """The attention core of a block (rotary first where the model uses it), and the
    kernels selective recomputation (Korthikanti et al. Sec. 5) runs again in backward:
    the unfused core's forward (a flash kernel recomputes its scores itself)."""
    v, tp = shape.value_bytes, shape.tp
    heads, kv_heads = -(-m.heads // tp) * shape.micro_batch, -(-m.kv_heads // tp) * shape.micro_batch
    core = kn.attention("attention", heads, kv_heads, shape.seq_len, m.head_dim, shape.attention, shape.style,
                        m.family is Family.GPT2, v)
    selective = core.forward if shape.attention is AttentionImpl.UNFUSED else ()
    if m.position is Position.ROPE:
        core = chain(kn.rotary("attention", shape.seq_len * (heads + kv_heads) * m.head_dim, shape.style, v), core)
    return core, selective


def _in_block(name: str, block: int | None) -> str:
    """A module's name within its block ('mlp.down_proj'), so that the kernels of identical
    blocks are one set of objects (their names say which module, the op says which block)."""
    prefix = f"model.layers.{block}."
    return name[len(prefix):] if block is not None and name.startswith(prefix) else name


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
    """A list of units as one (a block, or FSDP2's root group): their kernels in order."""
    passes = chain(*(u.passes for u in group))
    flags = None if all(u.trainable is None for u in group) else \
        tuple(f for u in group for f in (u.trainable if u.trainable is not None else (True,) * len(u.tensors)))
    ndims = () if any(u.tensors and not u.ndims for u in group) else tuple(d for u in group for d in u.ndims)
    return Unit(name, group[0].block, tuple(t for u in group for t in u.tensors), passes,
                tuple(k for u in group for k in u.selective), role=role, containers=group[0].containers[:2],
                trainable=flags, ndims=ndims, op_recompute=tuple(k for u in group for k in u.op_recompute))


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
