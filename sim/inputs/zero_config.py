"""DeepSpeed's `zero_optimization` section, read with DeepSpeed's code defaults.

Keys, aliases and defaults follow deepspeed/runtime/zero/config.py and offload_config.py
(DeepSpeed 0.19, commit edaa722); where the docs disagree with the code we take the code:
`overlap_comm` defaults to True only for stage 3 (docs: false), `stage3_prefetch_bucket_size`
is 5e7 (docs: 5e8), `pin_memory` is True (False before v0.19.5). Sizes are element counts. As in DeepSpeed
(pydantic, extra="forbid"), unknown keys are errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.core.enums import OffloadDevice, ZeroStage
from sim.core.errors import InputError, allowed
from sim.core.specs import AioConfig
from sim.inputs.schema import NOT_SIMULATED_YET, Key, check_value, read_table


@dataclass(frozen=True, slots=True, kw_only=True)
class OffloadConfig:
    """`offload_optimizer` / `offload_param` (offload_config.py)."""

    device: OffloadDevice = OffloadDevice.NONE
    pin_memory: bool = True
    ratio: float = 1.0          # optimizer only: fraction of sub-groups stepped on the CPU
    buffer_count: int = 4
    nvme_path: str | None = None
    buffer_size: int = 100_000_000   # parameters only: elements per pinned swap buffer (NVMe)
    pipeline_read: bool = False      # optimizer only (NVMe): read the next sub-group ahead
    pipeline_write: bool = False     # optimizer only (NVMe): write the last sub-group behind

    @property
    def enabled(self) -> bool:
        return self.device is not OffloadDevice.NONE


# The DeepSpeed releases whose ZeRO-3 is simulated (`[zero] deepspeed_version`):
# "0.19": v0.19.5 and later (0.19.8 read): the gradient partitions go to the host with a
#   non-blocking copy into pinned memory (PR #8207), `pin_memory` defaults to true;
# "0.6": v0.6.0-v0.19.4 (2022-03 to 2026-08): the same coalesced fetch path, but each
#   gradient partition goes down with a blocking `copy_` and `pin_memory` defaults to false;
# "0.5": v0.3.13-v0.5.4 (2021): per-parameter synchronous gathers (sim.engines.deepspeed_zero3_v05).
CURRENT_VERSION, BLOCKING_OFFLOAD_VERSION, LEGACY_VERSION = "0.19", "0.6", "0.5"
DEEPSPEED_VERSIONS = (CURRENT_VERSION, BLOCKING_OFFLOAD_VERSION, LEGACY_VERSION)


@dataclass(frozen=True, slots=True, kw_only=True)
class ZeroConfig:
    """The modelled `zero_optimization` knobs, after DeepSpeed's defaults and validators."""

    stage: ZeroStage = ZeroStage.NONE
    overlap_comm: bool = False
    contiguous_gradients: bool = True
    reduce_bucket_size: int = 500_000_000
    reduce_scatter: bool = True
    use_multi_rank_bucket_allreduce: bool = True
    allgather_partitions: bool = True
    allgather_bucket_size: int = 500_000_000
    round_robin_gradients: bool = False
    sub_group_size: int = 1_000_000_000
    prefetch_bucket_size: int = 50_000_000
    max_live_parameters: int = 1_000_000_000
    max_reuse_distance: int = 1_000_000_000
    param_persistence_threshold: int = 100_000
    model_persistence_threshold: int = 2**63 - 1
    module_granularity_threshold: int = 0
    use_all_reduce_for_fetch_params: bool = False
    allgather_sequential: bool = False
    zero_hpz_partition_size: int = 1
    zero_quantized_weights: bool = False
    zero_quantized_nontrainable_weights: bool = False
    zero_quantized_gradients: bool = False
    grad_accum_dtype: str | None = None   # DeepSpeed's data_types.grad_accum_dtype; None: the model's dtype
    deepspeed_version: str = CURRENT_VERSION   # the release whose ZeRO-3 runs (DEEPSPEED_VERSIONS above)
    offload_optimizer: OffloadConfig = field(default_factory=OffloadConfig)
    offload_param: OffloadConfig = field(default_factory=OffloadConfig)
    aio: AioConfig = field(default_factory=AioConfig)   # DeepSpeed's top-level `aio` (NVMe swaps)


_I, _B = int, bool
ZERO_KEYS = (
    Key("stage", _I, required=False, default=0, choices=(0, 1, 2, 3)),
    Key("overlap_comm", _B, required=False, default=None),
    Key("contiguous_gradients", _B, required=False, default=True, not_simulated=True),
    Key("reduce_bucket_size", _I, required=False, default=500_000_000, non_negative=True),
    Key("reduce_scatter", _B, required=False, default=True),
    Key("use_multi_rank_bucket_allreduce", _B, required=False, default=True),
    Key("allgather_partitions", _B, required=False, default=True),
    Key("allgather_bucket_size", _I, required=False, default=500_000_000, non_negative=True),
    Key("round_robin_gradients", _B, required=False, default=False, not_simulated=True),
    Key("sub_group_size", _I, required=False, default=1_000_000_000, non_negative=True),
    Key("prefetch_bucket_size", _I, required=False, default=50_000_000, non_negative=True),
    Key("max_live_parameters", _I, required=False, default=1_000_000_000, non_negative=True),
    Key("max_reuse_distance", _I, required=False, default=1_000_000_000, non_negative=True),
    Key("param_persistence_threshold", _I, required=False, default=100_000, non_negative=True),
    Key("model_persistence_threshold", _I, required=False, default=2**63 - 1, non_negative=True),
    Key("module_granularity_threshold", _I, required=False, default=0, non_negative=True, not_simulated=True),
    Key("use_all_reduce_for_fetch_params", _B, required=False, default=False, not_simulated=True),
    Key("allgather_sequential", _B, required=False, default=False, not_simulated=True),
    Key("zero_hpz_partition_size", _I, required=False, default=1, positive=True),
    Key("zero_quantized_weights", _B, required=False, default=False),
    Key("zero_quantized_nontrainable_weights", _B, required=False, default=False, not_simulated=True),
    Key("zero_quantized_gradients", _B, required=False, default=False),
    Key("grad_accum_dtype", str, required=False, default=None, choices=("fp32", "bf16", "fp16")),
    Key("deepspeed_version", str, required=False, default=CURRENT_VERSION, choices=DEEPSPEED_VERSIONS),
    Key("offload_optimizer", object, required=False, default=None),
    Key("offload_param", object, required=False, default=None),
)
# DeepSpeed's pydantic aliases (config.py): the stage3_* spelling of each field.
ALIASES = {f"stage3_{name}": name for name in (
    "prefetch_bucket_size", "param_persistence_threshold", "model_persistence_threshold",
    "max_live_parameters", "max_reuse_distance", "module_granularity_threshold",
    "use_all_reduce_for_fetch_params", "allgather_sequential")}
# Keys DeepSpeed accepts that change nothing we model (checkpointing, logging, init).
NOT_MODELLED = {
    "load_from_fp32_weights", "elastic_checkpoint", "ignore_unused_parameters", "legacy_stage1",
    "gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save", "memory_efficient_linear",
    "pipeline_loading_checkpoint", "override_module_apply", "log_trace_cache_warnings",
    "enable_sanity_checks", "save_muon_momentum_buffer_in_memory", "cpu_offload_use_pin_memory",
}
# Keys that would change performance in ways not modelled yet: only their defaults pass.
UNSUPPORTED_UNLESS_DEFAULT = {"mics_shard_size": -1, "mics_hierarchical_params_gather": False,
                              "zenflow": None, "zeropp_loco_param": None, "leaf_module": None}
# HF Trainer's "auto" rules (transformers integrations/deepspeed.py), from hidden size h.
HF_AUTO = {"reduce_bucket_size": lambda h: h * h, "prefetch_bucket_size": lambda h: int(0.9 * h * h),
           "param_persistence_threshold": lambda h: 10 * h}
OFFLOAD_KEYS = (
    Key("device", str, required=False, default="none", choices=tuple(OffloadDevice)),
    Key("pin_memory", _B, required=False, default=None),     # None: the release's default
    Key("nvme_path", str, required=False, default=None),
    Key("buffer_count", _I, required=False, default=None, positive=True),
    Key("buffer_size", _I, required=False, default=100_000_000, positive=True),
    Key("max_in_cpu", _I, required=False, default=1_000_000_000, non_negative=True, not_simulated=True),
    Key("pipeline_read", _B, required=False, default=False),
    Key("pipeline_write", _B, required=False, default=False),
    Key("fast_init", _B, required=False, default=False, not_simulated=True),
    Key("ratio", float, required=False, default=1.0, fraction=True),
    Key("super_offload", _B, required=False, default=False, not_simulated=True),
    Key("cpuadam_cores_perc", float, required=False, default=0.8, fraction=True, not_simulated=True),
)
_PARAM_ONLY = ("buffer_size", "max_in_cpu")
_OPTIMIZER_ONLY = ("pipeline_read", "pipeline_write", "fast_init", "ratio", "super_offload",
                   "cpuadam_cores_perc")
OFFLOAD_OPTIMIZER_KEYS = tuple(k for k in OFFLOAD_KEYS if k.name not in _PARAM_ONLY)
OFFLOAD_PARAM_KEYS = tuple(k for k in OFFLOAD_KEYS if k.name not in _OPTIMIZER_ONLY)


def zero_from_dict(raw: Mapping[str, Any], source: str | Path, prefix: str, *,
                   hidden: int) -> ZeroConfig:
    """Parse a `zero_optimization` mapping (DeepSpeed JSON or a scenario's [zero])."""
    if not isinstance(raw, Mapping):
        raise InputError(source, prefix.rstrip("."), "expected a table of zero_optimization keys")
    table = _normalise(raw, source, prefix, hidden)
    v = read_table(table, ZERO_KEYS, source, prefix)
    stage = ZeroStage(v.pop("stage"))
    if v["overlap_comm"] is None:  # validator overlap_comm_valid
        v["overlap_comm"] = stage == ZeroStage.PARAMETERS
    version = v["deepspeed_version"]
    opt = _offload(v.pop("offload_optimizer"), source, prefix + "offload_optimizer", optimizer=True, version=version)
    par = _offload(v.pop("offload_param"), source, prefix + "offload_param", optimizer=False, version=version)
    _check_stage_features(stage, v, opt, par, source, prefix)
    return ZeroConfig(stage=stage, offload_optimizer=opt, offload_param=par, **v)


def _normalise(raw: Mapping[str, Any], source: str | Path, prefix: str, hidden: int) -> dict[str, Any]:
    """Aliases -> field names; drop accepted no-op keys; deprecated cpu_offload; "auto"."""
    table: dict[str, Any] = {}
    for key, value in raw.items():
        name = ALIASES.get(key, key)
        if name in NOT_MODELLED:
            continue
        if name in UNSUPPORTED_UNLESS_DEFAULT:
            if value != UNSUPPORTED_UNLESS_DEFAULT[name]:
                raise InputError(source, prefix + key, f"{value!r}: {NOT_SIMULATED_YET}; "
                                 f"allowed: its default ({UNSUPPORTED_UNLESS_DEFAULT[name]!r})")
            continue
        if name in ("cpu_offload", "cpu_offload_param"):  # deprecated booleans (config.py)
            check_value(value, Key(key, bool), source, prefix + key)
            if value:
                target = "offload_optimizer" if name == "cpu_offload" else "offload_param"
                table.setdefault(target, {"device": "cpu"})
            continue
        if value == "auto":
            if name not in HF_AUTO:
                raise InputError(source, prefix + key, "'auto' is filled in by the HF Trainer; "
                                 f"zerosim fills it only for {allowed(sorted(HF_AUTO))}")
            value = HF_AUTO[name](hidden)
        if name in table:
            raise InputError(source, prefix + key, f"given twice (as {name} and an alias)")
        table[name] = value
    return table


def _offload(raw: Any, source: str | Path, dotted: str, *, optimizer: bool, version: str) -> OffloadConfig:
    """A string ('cpu') or a DeepSpeed offload table ({device = 'cpu', pin_memory = true});
    `pin_memory` left out is the release's default: true since v0.19.5 (PR #8207), false
    before (offload_constants.py `OFFLOAD_OPTIMIZER_PIN_MEMORY_DEFAULT`)."""
    if raw is None:
        return OffloadConfig()
    if isinstance(raw, str):
        raw = {"device": raw}
    keys = OFFLOAD_OPTIMIZER_KEYS if optimizer else OFFLOAD_PARAM_KEYS
    v = read_table(raw, keys, source, dotted + ".")
    device = OffloadDevice(v["device"])
    if device is OffloadDevice.NVME and not v["nvme_path"]:   # offload_config.py's validator
        raise InputError(source, dotted + ".nvme_path", "missing: device 'nvme' needs the path of the NVMe mount")
    default_count = 4 if optimizer else 5
    pinned = v["pin_memory"] if v["pin_memory"] is not None else version == CURRENT_VERSION
    return OffloadConfig(device=device, pin_memory=pinned, ratio=v.get("ratio", 1.0),
                         buffer_count=v["buffer_count"] if v["buffer_count"] is not None else default_count,
                         nvme_path=v["nvme_path"], buffer_size=v.get("buffer_size", 100_000_000),
                         pipeline_read=v.get("pipeline_read", False), pipeline_write=v.get("pipeline_write", False))


def _check_stage_features(stage: ZeroStage, v: Mapping[str, Any], opt: OffloadConfig,
                          par: OffloadConfig, source: str | Path, prefix: str) -> None:
    """DeepSpeed's per-stage rules (config.py validators, reference 1.2); the partial
    `ratio` exists only in stage3.py's sub-groups, and ZeRO++ only in ZeRO-3."""
    if par.enabled and stage != ZeroStage.PARAMETERS:
        raise InputError(source, prefix + "offload_param", f"needs stage 3, got stage {int(stage)}")
    if opt.enabled and stage == ZeroStage.NONE:
        raise InputError(source, prefix + "offload_optimizer", "needs ZeRO stage 1, 2 or 3")
    zeropp = [k for k in ("zero_quantized_weights", "zero_quantized_gradients") if v[k]]
    zeropp += ["zero_hpz_partition_size"] if v["zero_hpz_partition_size"] > 1 else []
    if zeropp and stage != ZeroStage.PARAMETERS:   # ZeRO++ lives in stage3.py and partition_parameters.py
        raise InputError(source, prefix + zeropp[0], f"ZeRO++ needs stage 3, got stage {int(stage)}")
    if opt.device is OffloadDevice.NVME and stage != ZeroStage.PARAMETERS:   # ZeRO-Infinity is ZeRO-3's
        raise InputError(source, prefix + "offload_optimizer.device", f"'nvme' (ZeRO-Infinity) needs stage 3, "
                         f"got stage {int(stage)}; allowed: none, cpu")
    if opt.ratio < 1.0 and stage != ZeroStage.PARAMETERS:   # partial offload: stage3.py's sub-groups only
        raise InputError(source, prefix + "offload_optimizer.ratio", f"{opt.ratio!r} (partial offload, Twin-Flow) "
                         f"needs stage 3, got stage {int(stage)}; allowed: 1.0 at stages 1-2")
