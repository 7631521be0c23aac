"""The [training], [fsdp] and [ddp] tables of a scenario file."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.analytic.recompute import METHODS, UNIFORM
from sim.core import limits as L
from sim.core.enums import OptimizerImpl, Recompute
from sim.core.errors import InputError
from sim.core.units import MB
from sim.inputs.schema import Key, check_value, read_table

PRECISIONS = ("fp32", "fp16", "bf16")
TRAINING_KEYS = (
    Key("seq_len", int, positive=True, maximum=L.MAX_SEQ_LEN),
    Key("micro_batch", int, required=False, default=None, positive=True, maximum=L.MAX_MICRO_BATCH),
    Key("global_batch", int, required=False, default=None, positive=True, maximum=L.MAX_BATCH),
    Key("grad_accum", int, required=False, default=None, positive=True, maximum=L.MAX_BATCH),
    Key("precision", str, required=False, default=None, choices=PRECISIONS),
    Key("recompute", str, required=False, default="none", choices=tuple(Recompute)),
    Key("gradient_clipping", float, required=False, default=None, non_negative=True),
    Key("partition_activations", bool, required=False, default=False),
    Key("cpu_checkpointing", bool, required=False, default=False),
    Key("optimizer_implementation", str, required=False, default=None, choices=tuple(OptimizerImpl)),
    Key("recompute_method", str, required=False, default=UNIFORM, choices=METHODS),
    Key("recompute_num_layers", int, required=False, default=1, positive=True, maximum=L.MAX_LAYERS),
    Key("delayed_parameter_update", bool, required=False, default=False),
    Key("contiguous_memory_optimization", bool, required=False, default=False),
    Key("number_checkpoints", int, required=False, default=None, positive=True, maximum=L.MAX_LAYERS),
)


def read_training(raw: Mapping[str, Any], source: Path, *, have_deepspeed: bool) -> dict[str, Any]:
    """Checked [training] values; precision is required unless a ds_config gives it."""
    t = read_table(raw, TRAINING_KEYS, source, "training.")
    if t["precision"] is None and not have_deepspeed:
        raise InputError(source, "training.precision", "missing required key; allowed: "
                         + ", ".join(PRECISIONS))
    if t["recompute"] != Recompute.FULL:
        for key, default in (("recompute_method", UNIFORM), ("recompute_num_layers", 1)):
            if t[key] != default:
                raise InputError(source, f"training.{key}", f"{t[key]!r} chooses the blocks of full "
                                 f"recomputation, but recompute is {t['recompute']!r}; allowed: recompute = "
                                 f"\"full\", or leave {key} out")
    return t


@dataclass(frozen=True, slots=True, kw_only=True)
class FsdpConfig:
    """FSDP2 `fully_shard` per transformer block and on the root
    (torch/distributed/fsdp/_fully_shard/_fully_shard.py).

    reshard_after_forward: True frees a block's parameters after forward (ZeRO-3-like),
    False keeps them until backward (ZeRO-2-like); an int k reshards them to k-way groups
    (1 < k < the shard group: each rank keeps 1/k of the unit and the backward all-gather
    runs inside the k ranks). replicate_degree r > 1 is HSDP: a (replicate, shard) mesh,
    parameters sharded over dp / r ranks and gradients all-reduced over the r replicas. reshard_root: the root's own `reshard_after_forward`; None is
    torch's default, which keeps the root unsharded after forward; True reshards it, so
    backward begins by gathering the root again. forward_prefetch / backward_prefetch:
    blocks gathered ahead (default 1 each: implicit CPU run-ahead forward,
    `_backward_prefetch` of one unit backward). backward_prefetch also takes FSDP1's
    `BackwardPrefetch` names: "BACKWARD_PRE" is depth 1; "BACKWARD_POST" (FSDP1 only:
    torch/distributed/fsdp/_runtime_utils.py `_post_backward_reshard` calls
    `_prefetch_handle` once the unit's gradients exist) issues the next unit's all-gather
    after this unit's backward ops instead of before them, in the host's issue order
    (`prefetch_post`). version: 2 is `fully_shard` (per-parameter
    DTensor shards); 1 is `FullyShardedDataParallel`, whose FlatParameter is gathered in place
    (torch/distributed/fsdp/_flat_param.py: the all-gather writes the unsharded flat
    parameter and the module's parameters are views of it, so no copy-out), with the
    same unit per block and root.
    """

    version: int = 2
    reshard_after_forward: bool | int = True
    reshard_root: bool | None = None
    forward_prefetch: int = 1
    backward_prefetch: int = 1
    prefetch_post: bool = False       # backward_prefetch = "BACKWARD_POST"
    param_dtype: str | None = None    # None: the training precision
    reduce_dtype: str | None = None   # None: param_dtype
    cpu_offload: bool = False
    replicate_degree: int = 1

    def __post_init__(self) -> None:
        if self.prefetch_post and self.backward_prefetch != 1:
            raise ValueError("BACKWARD_POST prefetches one unit: backward_prefetch must be 1")

    @property
    def post_forward(self) -> int:
        """The k of an int reshard_after_forward (0: a bool)."""
        r = self.reshard_after_forward
        return 0 if isinstance(r, bool) else r


BACKWARD_PREFETCH_NAMES = {"NONE": (0, False), "BACKWARD_PRE": (1, False), "BACKWARD_POST": (1, True)}
FSDP_KEYS = (
    Key("version", int, required=False, default=2, choices=(1, 2)),
    Key("reshard_after_forward", object, required=False, default=True),
    Key("reshard_root", bool, required=False, default=None),
    Key("forward_prefetch", int, required=False, default=1, non_negative=True),
    Key("backward_prefetch", object, required=False, default=1),
    Key("param_dtype", str, required=False, default=None, choices=PRECISIONS),
    Key("reduce_dtype", str, required=False, default=None, choices=PRECISIONS),
    Key("cpu_offload", bool, required=False, default=False),
    Key("replicate_degree", int, required=False, default=1, positive=True),
)


def fsdp_from_table(raw: Mapping[str, Any], source: Path) -> FsdpConfig:
    """[fsdp]: FSDP2's fully_shard arguments; HSDP with `replicate_degree`, an int
    `reshard_after_forward` (checked against the data-parallel degree by the engine)."""
    v = read_table(raw, FSDP_KEYS, source, "fsdp.")
    reshard = v.pop("reshard_after_forward")
    if not isinstance(reshard, bool):
        check_value(reshard, Key("reshard_after_forward", int, positive=True), source,
                    "fsdp.reshard_after_forward")
    depth, post = _backward_prefetch(v.pop("backward_prefetch"), source)
    return FsdpConfig(reshard_after_forward=reshard, backward_prefetch=depth, prefetch_post=post, **v)


def _backward_prefetch(value: Any, source: Path) -> tuple[int, bool]:
    """[fsdp] backward_prefetch: a depth (int >= 0) or FSDP1's `BackwardPrefetch` name, in
    any case as Composer reads it (NONE, BACKWARD_PRE, BACKWARD_POST) -> (depth, issued
    after the unit's backward)."""
    allowed = f"allowed: an int >= 0 (units gathered ahead) or one of {', '.join(BACKWARD_PREFETCH_NAMES)}"
    if isinstance(value, str):
        if value.upper() not in BACKWARD_PREFETCH_NAMES:
            raise InputError(source, "fsdp.backward_prefetch", f"{value!r} is not valid; {allowed}")
        return BACKWARD_PREFETCH_NAMES[value.upper()]
    try:
        return check_value(value, Key("backward_prefetch", int, non_negative=True), source,
                           "fsdp.backward_prefetch"), False
    except InputError:
        raise InputError(source, "fsdp.backward_prefetch", f"{value!r} is not valid; {allowed}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class DdpConfig:
    """torch DistributedDataParallel; `bucket_cap` in bytes (default 25 MB, first bucket
    1 MB as in torch). `broadcast_buffers` (torch's default True): rank 0's module buffers
    are broadcast before a forward that follows a synchronised one (distributed.py
    `_pre_forward` / `will_sync_module_buffers`). `parameters_as_bucket_view` is
    ZeroRedundancyOptimizer's flag (only its default is simulated)."""

    bucket_cap: float = 25 * MB
    broadcast_buffers: bool = True


DDP_KEYS = (
    Key("bucket_cap_MB", float, required=False, default=25.0 * MB, positive=True),
    Key("broadcast_buffers", bool, required=False, default=True),
    Key("parameters_as_bucket_view", bool, required=False, default=False, not_simulated=True),
)


def ddp_from_table(raw: Mapping[str, Any], source: Path) -> DdpConfig:
    v = read_table(raw, DDP_KEYS, source, "ddp.")
    return DdpConfig(bucket_cap=v["bucket_cap"], broadcast_buffers=v["broadcast_buffers"])


@dataclass(frozen=True, slots=True, kw_only=True)
class MegatronConfig:
    """Megatron-Core's data-parallel wrapper and optimizer, as its training arguments name
    them (megatron/core/distributed/distributed_data_parallel_config.py, megatron/training/
    arguments.py; sim/engines/megatron.py says what each does to the schedule).

    distributed_optimizer (`--use-distributed-optimizer`): fp32 master weights and Adam
    states sharded over data parallelism; gradients reduce-scattered, parameters
    all-gathered after the step. overlap_grad_reduce / overlap_param_gather: the bucketed
    reductions run during backward, the all-gathers during the next forward.
    tp_comm_overlap: Transformer Engine's userbuffers hide the tensor-parallel all-gathers
    and reduce-scatters behind the GEMMs (needs sequence parallelism). bucket_size:
    elements per gradient bucket; None is Megatron's max(40M, 1M x dp) with
    overlap_grad_reduce and one bucket without it. grad_reduce_in_fp32: None is Megatron's
    choice (fp32 with bf16, `accumulate_allreduce_grads_in_fp32`; the training dtype else).
    """

    distributed_optimizer: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    tp_comm_overlap: bool = False
    bucket_size: int | None = None
    grad_reduce_in_fp32: bool | None = None


MEGATRON_KEYS = (
    Key("distributed_optimizer", bool, required=False, default=False),
    Key("overlap_grad_reduce", bool, required=False, default=False),
    Key("overlap_param_gather", bool, required=False, default=False),
    Key("tp_comm_overlap", bool, required=False, default=False),
    Key("bucket_size", int, required=False, default=None, positive=True),
    Key("grad_reduce_in_fp32", bool, required=False, default=None),
)


def megatron_from_table(raw: Mapping[str, Any], source: Path) -> MegatronConfig:
    """[megatron]; the flag combinations Megatron's own argument checks refuse are refused
    here with its reason (megatron/training/arguments.py)."""
    v = read_table(raw, MEGATRON_KEYS, source, "megatron.")
    if v["overlap_param_gather"] and not v["distributed_optimizer"]:
        raise InputError(source, "megatron.overlap_param_gather", "needs distributed_optimizer = true "
                         "(Megatron: '--overlap-param-gather only supported with distributed optimizer')")
    if v["bucket_size"] is not None and not v["overlap_grad_reduce"]:
        raise InputError(source, "megatron.bucket_size", f"{v['bucket_size']} has no effect without "
                         "overlap_grad_reduce = true (Megatron reduces one bucket after backward then); "
                         "allowed: overlap_grad_reduce = true, or leave bucket_size out")
    if v["overlap_param_gather"] and not v["overlap_grad_reduce"]:
        raise InputError(source, "megatron.overlap_param_gather", "needs overlap_grad_reduce = true "
                         "(Megatron asserts --overlap-grad-reduce with --overlap-param-gather)")
    return MegatronConfig(**v)
