"""The [training], [fsdp] and [ddp] tables of a scenario file."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.analytic.activations import Recompute
from sim.errors import InputError
from sim.schema import Key, check_value, read_table
from sim.units import MB

PRECISIONS = ("fp32", "fp16", "bf16")
TRAINING_KEYS = (
    Key("seq_len", int, positive=True),
    Key("micro_batch", int, required=False, default=None, positive=True),
    Key("global_batch", int, required=False, default=None, positive=True),
    Key("grad_accum", int, required=False, default=None, positive=True),
    Key("precision", str, required=False, default=None, choices=PRECISIONS),
    Key("recompute", str, required=False, default="none", choices=tuple(Recompute)),
    Key("gradient_clipping", float, required=False, default=None, non_negative=True),
    Key("partition_activations", bool, required=False, default=False),
)


def read_training(raw: Mapping[str, Any], source: Path, *, have_deepspeed: bool) -> dict[str, Any]:
    """Checked [training] values; precision is required unless a ds_config gives it."""
    t = read_table(raw, TRAINING_KEYS, source, "training.")
    if t["precision"] is None and not have_deepspeed:
        raise InputError(source, "training.precision", "missing required key; allowed: "
                         + ", ".join(PRECISIONS))
    return t


@dataclass(frozen=True, slots=True, kw_only=True)
class FsdpConfig:
    """FSDP2 `fully_shard` per transformer block (torch/distributed/fsdp/_fully_shard).

    reshard_after_forward: True frees parameters after forward (ZeRO-3-like), False
    keeps them until backward (ZeRO-2-like), an int k reshards to k-way groups (hpZ-like).
    forward_prefetch / backward_prefetch: blocks gathered ahead (default 1 each: implicit
    CPU run-ahead forward, `_backward_prefetch` of one unit backward).
    """

    reshard_after_forward: bool | int = True
    forward_prefetch: int = 1
    backward_prefetch: int = 1
    param_dtype: str | None = None    # None: the training precision
    reduce_dtype: str | None = None   # None: param_dtype
    cpu_offload: bool = False
    replicate_degree: int = 1         # HSDP: replicate x shard = dp


FSDP_KEYS = (
    Key("reshard_after_forward", object, required=False, default=True),
    Key("forward_prefetch", int, required=False, default=1, non_negative=True),
    Key("backward_prefetch", int, required=False, default=1, non_negative=True),
    Key("param_dtype", str, required=False, default=None, choices=PRECISIONS),
    Key("reduce_dtype", str, required=False, default=None, choices=PRECISIONS),
    Key("cpu_offload", bool, required=False, default=False),
    Key("replicate_degree", int, required=False, default=1, positive=True),
)


def fsdp_from_table(raw: Mapping[str, Any], source: Path) -> FsdpConfig:
    v = read_table(raw, FSDP_KEYS, source, "fsdp.")
    reshard = v["reshard_after_forward"]
    if not isinstance(reshard, bool):
        reshard = check_value(reshard, Key("reshard_after_forward", int, positive=True),
                              source, "fsdp.reshard_after_forward")
        if reshard == 1:
            raise InputError(source, "fsdp.reshard_after_forward",
                             "an int k must be >= 2 (k = 1 would keep every parameter); allowed: "
                             "true, false, or an int >= 2")
    return FsdpConfig(**{**v, "reshard_after_forward": reshard})


@dataclass(frozen=True, slots=True, kw_only=True)
class DdpConfig:
    """torch DistributedDataParallel; `bucket_cap` in bytes (default 25 MB, first bucket
    1 MB as in torch). `parameters_as_bucket_view` is ZeroRedundancyOptimizer's flag."""

    bucket_cap: float = 25 * MB
    parameters_as_bucket_view: bool = False


DDP_KEYS = (
    Key("bucket_cap_MB", float, required=False, default=25.0 * MB, positive=True),
    Key("parameters_as_bucket_view", bool, required=False, default=False),
)


def ddp_from_table(raw: Mapping[str, Any], source: Path) -> DdpConfig:
    v = read_table(raw, DDP_KEYS, source, "ddp.")
    return DdpConfig(bucket_cap=v["bucket_cap"], parameters_as_bucket_view=v["parameters_as_bucket_view"])
