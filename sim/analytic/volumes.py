"""Bytes per rank per step by collective kind, for each engine as implemented, in closed
form from the model's tensors: the twin of the planner's collectives (sim/engines).

Exact under stated assumptions: DeepSpeed ZeRO-3 with `stage3_max_reuse_distance = 0`
(every module gathered once forward and once backward) and untied embeddings; padding as
the engines pad (ZeRO-1/2: flat buffer to 2 x dp; ZeRO-3: each tensor to dp pieces;
FSDP2: dim 0 of each tensor to dp rows).
"""

from __future__ import annotations

from sim.analytic.comm import ddp_volume, dim0_padded, flat_padded, tensor_padded, zero_volume_paper
from sim.analytic.placement import holds, tp_shape
from sim.analytic.stages import Stages, as_stages
from sim.core.enums import ZeroStage
from sim.core.model import ModelSpec, module_tree


def _ar(n_bytes: float, dp: int) -> float:
    return 2 * (dp - 1) / dp * n_bytes


def _once(n_bytes: float, dp: int) -> float:
    return (dp - 1) / dp * n_bytes


def deepspeed_volume(tensors: list[tuple[int, bool]], dp: int, stage: int, *, grad_accum: int, elem: int,
                     clipping: bool, persistence_threshold: int = 100_000,
                     multi_rank_allreduce: bool = True, recompute_share: float = 0.0,
                     fp16: bool = False, grad_tensors: list[int] | None = None) -> dict[str, float]:
    """DeepSpeed ZeRO-0/1/2/3 (reference 1.5) over one rank's tensors (numel, in a block?),
    grad-norm all-reduce of 4 B when clipping. ZeRO-3 gathers each module for forward, for
    backward and, for the share `recompute_share` of the blocks that full recomputation
    runs again, for the recomputed forward as well (every block has the same tensors).
    `grad_tensors`: the numels that get gradients, when not all do (LoRA: the adapters);
    at stages 1-2 only they are partitioned, so the post-step gather is theirs too."""
    numels = [n for n, _ in tensors]
    grads = numels if grad_tensors is None else grad_tensors
    psi = sum(grads)
    out: dict[str, float] = {}
    # the step's norm: always at stages 1-3 (fp32 at 1-2, fp64 at 3), with clipping at stage 0;
    # fp16 at stages 1-2 adds an overflow check
    norm = _ar(8.0 if stage == ZeroStage.PARAMETERS else 4.0, dp) if (clipping or stage > 0) else 0.0
    if fp16 and stage in (ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS):
        norm += _ar(4.0, dp)
    if stage == ZeroStage.PARAMETERS:
        def gathered(in_blocks: bool) -> int:
            return sum(tensor_padded(n, dp) for n, block in tensors if block == in_blocks and n > persistence_threshold)
        persistent = sum(tensor_padded(n, dp) for n in numels if n <= persistence_threshold)
        uses = gathered(True) * (2 + recompute_share) + 2 * gathered(False)   # recomputed blocks: 3 gathers
        out["all_gather"] = grad_accum * _once(elem * uses, dp) + (_once(elem * persistent, dp) if persistent else 0.0)
        out["reduce_scatter"] = grad_accum * _once(elem * sum(tensor_padded(n, dp) for n in grads), dp)
        out["all_reduce"] = norm
        return {k: v for k, v in out.items() if v}
    reductions = grad_accum if stage == ZeroStage.GRADIENTS else 1
    if stage > 0 and not multi_rank_allreduce:
        out["reduce"] = reductions * _once(elem * psi, dp)
        out["all_reduce"] = norm
    else:
        out["all_reduce"] = reductions * _ar(elem * psi, dp) + norm
    if stage > 0:
        out["all_gather"] = _once(elem * flat_padded(psi, dp), dp)
    return {k: v for k, v in out.items() if v}


def bf16_optimizer_volume(psi: int, dp: int, *, accumulation_bytes: int, elem: int) -> dict[str, float]:
    """DeepSpeed's BF16_Optimizer (deepspeed/runtime/bf16_optimizer.py) over one rank's psi
    parameters: the accumulated gradients all-reduced once per step in the accumulation
    dtype, the global norm (4 B fp32, always computed), and the 16-bit partitions
    all-gathered after the step (`update_lp_params`)."""
    out = {"all_reduce": _ar(accumulation_bytes * psi, dp) + _ar(4.0, dp),
           "all_gather": _once(elem * flat_padded(psi, dp), dp)}
    return {k: v for k, v in out.items() if v}


def ddp_engine_volume(psi: int, dp: int, *, zero_redundancy: bool, clipping: bool,
                      buffer_bytes: float = 0.0) -> dict[str, float]:
    """torch DDP: fp32 gradients all-reduced once per step; ZeroRedundancyOptimizer adds a
    broadcast of every fp32 parameter from its owner; `broadcast_buffers` one broadcast of
    the module buffers per step (the first micro-step's forward)."""
    out = {"all_reduce": ddp_volume(psi, dp, bytes_per_element=4).all_reduce + (_ar(4.0, dp) if clipping else 0.0)}
    broadcast = _once(4.0 * psi, dp) if zero_redundancy else 0.0
    broadcast += _once(buffer_bytes, dp)
    if broadcast:
        out["broadcast"] = broadcast
    return out


def megatron_engine_volume(padded: int, dp: int, *, grad_bytes: int, param_bytes: int,
                           distributed_optimizer: bool, clipping: bool, fp16: bool) -> dict[str, float]:
    """Megatron-Core: the gradient buckets (`padded` elements in all) all-reduced once per
    step, or reduce-scattered with the distributed optimizer, which then all-gathers the
    16-bit parameters of every bucket; the clipping norm and fp16's found-inf check are
    4-byte all-reduces."""
    small = (_ar(4.0, dp) if clipping else 0.0) + (_ar(4.0, dp) if fp16 else 0.0)
    if not distributed_optimizer:
        return {"all_reduce": _ar(grad_bytes * padded, dp) + small}
    out = {"reduce_scatter": _once(grad_bytes * padded, dp), "all_gather": _once(param_bytes * padded, dp)}
    if small:
        out["all_reduce"] = small
    return out


def fsdp2_engine_volume(m: ModelSpec, dp: int, *, grad_accum: int, param_bytes: int, reduce_bytes: int,
                        reshard_after_forward: bool, reshard_root: bool, clipping: bool, replicate: int = 1,
                        post: int = 0, tp: int = 1, pp: int | Stages = 1) -> dict[str, float]:
    """FSDP2 per block + root: forward all-gather of every unit, backward all-gather of the
    resharded blocks (and of the root when it is resharded too), one reduce-scatter per unit,
    every micro-step; only the tensors with gradients are reduced (LoRA: the adapters). With
    HSDP (`replicate` r) everything shards over dp / r ranks and each reduced shard is
    all-reduced over the r replicas; with an int reshard_after_forward (`post` k) the blocks'
    backward all-gathers run over k ranks. With tensor parallelism (`tp`, FSDP2 + TP: the 2D
    of torchtitan) FSDP shards each rank's TP shard (sim.analytic.placement.tp_shape). With
    pipeline stages (`pp`: torch.distributed.pipelining with FSDP2, blocks never resharded
    after forward) the first stage's units are gathered once per step and reduced once, after
    its last micro-batch (sim.engines.fsdp2)."""
    shard = dp // replicate
    split = as_stages(m.layers, pp)
    mods = [mod for mod in module_tree(m) if split.pp == 1 or holds(mod, split, 0)]
    blocks = sum(dim0_padded(tp_shape(mod, t.shape, tp), shard) for mod in mods if mod.block is not None
                 for t in mod.tensors)
    total = sum(dim0_padded(tp_shape(mod, t.shape, tp), shard) for mod in mods for t in mod.tensors)
    grads = sum(dim0_padded(tp_shape(mod, t.shape, tp), shard) for mod in mods for t in mod.tensors if t.trainable)
    if split.pp > 1:
        out = {"all_gather": _once(param_bytes * total, shard), "reduce_scatter": _once(reduce_bytes * grads, shard),
               "all_reduce": _ar(reduce_bytes * grads / shard, replicate) + (_ar(4.0, dp) if clipping else 0.0)}
        return {k: v for k, v in out.items() if v}
    backward = blocks if reshard_after_forward else 0
    gathered = total + (backward if not post else 0) + ((total - blocks) if reshard_root else 0)
    out = {"all_gather": grad_accum * (_once(param_bytes * gathered, shard) + _once(param_bytes * backward, post or 1)),
           "reduce_scatter": grad_accum * _once(reduce_bytes * grads, shard)}
    out["all_reduce"] = grad_accum * _ar(reduce_bytes * grads / shard, replicate) + (_ar(4.0, dp) if clipping else 0.0)
    return {k: v for k, v in out.items() if v}


def paper_volume(m: ModelSpec, dp: int, stage: int, *, grad_accum: int, elem: int) -> dict[str, float]:
    """The ZeRO paper's schedules by kind: stage 0 all-reduce; 1 reduce-scatter + all-gather;
    2 reduce + all-gather; 3 broadcast (forward and backward) + reduce."""
    psi = sum(t.numel for mod in module_tree(m) for t in mod.tensors)
    v = zero_volume_paper(psi, dp, ZeroStage(stage), grad_accum=grad_accum, bytes_per_element=elem)
    if stage == ZeroStage.PARAMETERS:
        return {"broadcast": v.all_gather_forward + v.all_gather_backward, "reduce": v.reduce_scatter}
    out = {"all_reduce": v.all_reduce, "reduce_scatter": v.reduce_scatter, "reduce": v.reduce,
           "all_gather": v.all_gather_after_step}
    return {k: x for k, x in out.items() if x}


def tensor_parallel_volume(blocks: int, embedding: bool, tp: int, *, seq_len: int, micro_batch: int,
                           hidden: int, elem: int, grad_accum: int, sequence_parallel: bool,
                           recomputed: int = 0, checkpoint_gathers: int = 0) -> dict[str, float]:
    """Megatron: per block and micro-step 2 all-reduces of s b h forward, 2 backward, 2 more
    for each of the `recomputed` blocks whose forward runs again; one forward for a
    vocab-parallel embedding. Sequence parallelism turns each into an all-gather plus a
    reduce-scatter (the same volume). DeepSpeed's partitioned checkpoints add one s b h
    all-gather per checkpoint (`checkpoint_gathers` per micro-step) before recomputation."""
    if tp == 1:
        return {}
    size = elem * seq_len * micro_batch * hidden
    count = grad_accum * (4 * blocks + 2 * recomputed + (1 if embedding else 0))
    gathers = grad_accum * checkpoint_gathers * _once(size, tp)
    if sequence_parallel:
        return {"all_gather": count * _once(size, tp) + gathers, "reduce_scatter": count * _once(size, tp)}
    out = {"all_reduce": count * _ar(size, tp)}
    if gathers:
        out["all_gather"] = gathers
    return out


def pipeline_volume(stage: int, pp: int, *, seq_len: int, micro_batch: int, hidden: int, tp: int,
                    sequence_parallel: bool, grad_accum: int, virtual_stages: int = 1,
                    partitioned: bool = False, elem: int = 2) -> dict[str, float]:
    """1F1B sends of one stage: activations forward unless last, gradients back unless first;
    with v model chunks per stage (interleaved), each chunk sends unless it is the last (first)
    of the whole pipeline: v - [stage is last] forward, v - [stage is first] back; `elem`
    bytes per activation element. `partitioned` (DeepSpeed's PipelineEngine under TP): each send carries 1/tp, and the
    stage all-gathers over TP what it receives (forward unless first) and, in backward
    unless last, its own output and the received gradient (pipe/engine.py)."""
    if pp == 1:
        return {}
    size = elem * seq_len * micro_batch * hidden / (tp if sequence_parallel else 1)
    sends = (virtual_stages - (stage == pp - 1)) + (virtual_stages - (stage == 0))
    if not partitioned:
        return {"send_recv": grad_accum * sends * size}
    gathers = (stage > 0) + 2 * (stage < pp - 1)
    return {"send_recv": grad_accum * sends * size / tp, "all_gather": grad_accum * gathers * _once(size, tp)}


def add(*parts: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in parts:
        for k, v in part.items():
            out[k] = out.get(k, 0.0) + v
    return out
