"""How tensor and pipeline parallelism split a model's parameters across ranks.

Megatron layout (Shoeybi et al., arXiv 1909.08053; Narayanan et al., arXiv 2104.04473):
Linear weights of a block are split t ways (column / row parallel) while norms stay
replicated; the embedding and the lm_head are vocab-parallel (split t ways); stage 0
holds the embedding, the last stage the final norm and head (a tied head keeps its own
copy of the embedding on the last stage when pp > 1); each stage holds L/pp blocks, or the
uneven split a `Stages` gives (sim.analytic.stages; a plain `pp` is the even one).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sim.analytic.params import embedding_params, layer_params, norm_params
from sim.analytic.stages import Stages, as_stages
from sim.core.model import ModelSpec, ModuleSpec, Place, Position, module_tree


def block_params_per_rank(m: ModelSpec, tp: int) -> float:
    """One block's parameters on one TP rank: Linear weights / t, two norms replicated."""
    norms = 2 * norm_params(m)
    return (layer_params(m) - norms) / tp + norms


def params_per_stage(m: ModelSpec, tp: int, pp: int | Stages) -> list[float]:
    """Parameters held by one rank of each pipeline stage (first to last)."""
    split = as_stages(m.layers, pp)
    pp = split.pp
    stages = [n * block_params_per_rank(m, tp) for n in split.counts()]
    positions = m.max_positions * m.hidden if m.position is Position.LEARNED else 0
    stages[0] += (embedding_params(m) - positions) / tp + positions
    head = m.vocab * m.hidden / tp
    if m.tied_embeddings and pp == 1:
        head = 0.0
    stages[-1] += norm_params(m) + head
    return stages


def holds(mod: ModuleSpec, split: Stages, stage: int) -> bool:
    """Does pipeline stage `stage` hold module `mod`? Its blocks; the embedding(s) on the
    first stage, the final norm and head on the last."""
    if mod.block is not None:
        return mod.block in split.blocks(stage)
    return stage == (0 if mod.kind == "embedding" else split.pp - 1)


def rank_tensors(m: ModelSpec, tp: int, pp: int | Stages, stage: int, *,
                 trainable_only: bool = False) -> list[tuple[int, bool]]:
    """(numel on one TP rank, inside a block?) of every tensor pipeline stage `stage` holds:
    Linear and embedding weights split t ways (rounded up), norms replicated; with
    `trainable_only`, only the tensors that get gradients (LoRA freezes the base)."""
    split = as_stages(m.layers, pp)
    out = []
    for mod in module_tree(m):
        if holds(mod, split, stage):
            for t in mod.tensors:
                if trainable_only and not t.trainable:
                    continue
                numel = t.numel if mod.kind == "norm" or tp == 1 else -(-t.numel // tp)
                out.append((numel, mod.block is not None))
    return out


def chunk_tensors(m: ModelSpec, tp: int, pp: int | Stages, chunks: int, stage: int) -> list[list[int]]:
    """Numel on one TP rank of every tensor of pipeline stage `stage`, by its local model
    chunk (interleaved 1F1B: the model cut into pp x chunks pieces of L / (pp chunks) blocks,
    stage k holding pieces k, k + pp, ...; the embedding in the first piece, the head in
    the last), in forward order; rank_tensors' split rule. One chunk: the stage's tensors
    under any split."""
    if chunks == 1:
        return [[n for n, _ in rank_tensors(m, tp, pp, stage)]]
    pp = as_stages(m.layers, pp).pp
    per = m.layers // (pp * chunks)
    out: list[list[int]] = [[] for _ in range(chunks)]
    for mod in module_tree(m):
        if mod.block is not None:
            piece = mod.block // per
            if piece % pp != stage:
                continue
            local = piece // pp
        elif stage == (0 if mod.kind == "embedding" else pp - 1):
            local = 0 if mod.kind == "embedding" else chunks - 1
        else:
            continue
        out[local] += [t.numel if mod.kind == "norm" or tp == 1 else -(-t.numel // tp) for t in mod.tensors]
    return out


def rank_grad_shapes(m: ModelSpec, tp: int, pp: int | Stages, stage: int) -> list[tuple[int, int]]:
    """(numel on one TP rank, dimensions) of every tensor of pipeline stage `stage` that gets
    a gradient, in rank_tensors' order."""
    split = as_stages(m.layers, pp)
    out = []
    for mod in module_tree(m):
        if holds(mod, split, stage):
            out += [(t.numel if mod.kind == "norm" or tp == 1 else -(-t.numel // tp), len(t.shape))
                    for t in mod.tensors if t.trainable]
    return out


ROW_PARALLEL = (Place.ATTN_OUT, Place.FFN_OUT)


def tp_shape(mod: ModuleSpec, shape: tuple[int, ...], tp: int) -> tuple[int, ...]:
    """A tensor's shape on one tensor-parallel rank (Megatron's split, which torchtitan's
    colwise / rowwise plans share): norms replicated; a row-parallel Linear's weight split
    on its input features (dim 1 of nn.Linear's (out, in), dim 0 of GPT-2's Conv1D (in, out));
    every other weight (column-parallel Linears, the vocab-parallel embedding and head) and
    every bias on its output dimension (dim 0; dim 1 of a Conv1D weight). The elements are
    rank_tensors' (ceil(numel / tp) where the split divides)."""
    if tp == 1 or mod.kind == "norm":
        return shape
    dim = 0
    if len(shape) == 2:
        row = mod.place in ROW_PARALLEL
        dim = (0 if row else 1) if mod.conv1d else (1 if row else 0)
    return tuple(-(-d // tp) if i == dim else d for i, d in enumerate(shape))


@dataclass(frozen=True, slots=True)
class TensorGroup:
    """`count` identical parameter tensors of one pipeline stage (one per block it holds)."""

    numel: int                  # elements on one TP rank
    shape: tuple[int, ...]      # the unsplit tensor's shape
    count: int
    in_block: bool
    trainable: bool = True      # False: LoRA's frozen base (no gradient, no optimizer state)
    local_shape: tuple[int, ...] = ()   # its shape on one TP rank (tp_shape)


def stage_census(m: ModelSpec, tp: int, pp: int | Stages, stage: int) -> list[TensorGroup]:
    """The tensors pipeline stage `stage` holds, in forward order, without a loop over the
    layers: one block's tensors, each counted once per block on the stage (every block is
    the same), with the embedding before them on the first stage and the final norm and head
    after them on the last. Split as `rank_tensors` splits them."""
    split = as_stages(m.layers, pp)
    per, pp = split.counts()[stage], split.pp
    before: list[TensorGroup] = []
    block: list[TensorGroup] = []
    after: list[TensorGroup] = []
    for mod in module_tree(replace(m, layers=1)):
        for t in mod.tensors:
            numel = t.numel if mod.kind == "norm" or tp == 1 else -(-t.numel // tp)
            local = tp_shape(mod, t.shape, tp)
            if mod.block is not None:
                block.append(TensorGroup(numel, t.shape, per, True, t.trainable, local))
            elif mod.kind == "embedding":
                if stage == 0:
                    before.append(TensorGroup(numel, t.shape, 1, False, t.trainable, local))
            elif stage == pp - 1:
                after.append(TensorGroup(numel, t.shape, 1, False, t.trainable, local))
    return before + block + after


def census_numel(groups: list[TensorGroup]) -> int:
    return sum(g.numel * g.count for g in groups)


def trainable(groups: list[TensorGroup]) -> list[TensorGroup]:
    """The groups that get gradients and optimizer state (all of them without LoRA)."""
    return [g for g in groups if g.trainable]


def frozen_numel(groups: list[TensorGroup]) -> int:
    """Elements of LoRA's frozen base (0 without LoRA)."""
    return sum(g.numel * g.count for g in groups if not g.trainable)
