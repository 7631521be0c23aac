"""A DeepSpeed `ds_config.json`, read as DeepSpeed reads it, and DeepSpeed's batch rule.

Top-level keys follow deepspeed/runtime/config.py and constants.py; the
`zero_optimization` section is `sim.inputs.zero_config`. Keys DeepSpeed knows but that do not
change step time or memory (logging, schedulers, checkpoint I/O) are accepted and have no
effect (`NO_EFFECT`); keys that would change them in ways not simulated yet are accepted
at their defaults only and refused otherwise ("not simulated yet", exit 2).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sim.core import limits as L
from sim.core.errors import InputError, allowed
from sim.inputs.aio_config import read_aio
from sim.inputs.reading import read_json
from sim.inputs.schema import NOT_SIMULATED_YET, Key, check_value, read_table
from sim.inputs.zero_config import ZeroConfig, zero_from_dict

NO_EFFECT = {   # logging, schedules, seeds, checkpoint I/O: no effect on step time or memory
    "optimizer", "scheduler", "steps_per_print", "wall_clock_breakdown", "dump_state",
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "comms_logger",
    "flops_profiler", "tensorboard", "wandb", "csv_monitor", "comet", "memory_breakdown",
    "seed", "checkpoint",
}
SIMULATED = {"train_micro_batch_size_per_gpu", "train_batch_size", "gradient_accumulation_steps", "fp16",
             "bf16", "bfloat16", "gradient_clipping", "zero_optimization", "communication_data_type",
             "activation_checkpointing", "aio", "data_types"}
# Keys that change the work in ways not simulated yet: accepted at their defaults only.
NOT_SIMULATED = {"prescale_gradients": False, "gradient_predivide_factor": 1.0,
                 "gradient_accumulation_dtype": None}
DATA_TYPES_KEYS = (Key("grad_accum_dtype", str, required=False, default=None, choices=("fp32", "bf16", "fp16")),)
CHECKPOINT_KEYS = (   # activation_checkpointing (deepspeed/runtime/activation_checkpointing/config.py)
    Key("partition_activations", bool, required=False, default=False),
    Key("cpu_checkpointing", bool, required=False, default=False),   # D2H in forward, H2D before recompute
    Key("contiguous_memory_optimization", bool, required=False, default=False),
    Key("number_checkpoints", int, required=False, default=None, positive=True),
    Key("synchronize_checkpoint_boundary", bool, required=False, default=False, not_simulated=True),
    Key("profile", bool, required=False, default=False, not_simulated=True),
)
ADAM_LIKE = ("adam", "adamw", "fusedadam", "cpuadam", "deepspeedcpuadam")


@dataclass(frozen=True, slots=True, kw_only=True)
class DeepSpeedSettings:
    """What a ds_config.json says about a step; batch keys may be None (filled later)."""

    path: Path
    train_batch_size: int | None
    micro_batch: int | None
    grad_accum: int | None
    precision: str                  # 'fp16' | 'bf16' | 'fp32'
    gradient_clipping: float
    communication_data_type: str | None
    partition_activations: bool
    cpu_checkpointing: bool
    contiguous_memory_optimization: bool = False
    number_checkpoints: int | None = None
    zero: ZeroConfig
    torch_adam: bool = False        # optimizer.params.torch_adam: torch.optim's Adam, not FusedAdam


def read_deepspeed_config(path: Path, *, hidden: int) -> DeepSpeedSettings:
    """Parse ds_config.json; `hidden` fills the HF 'auto' bucket sizes."""
    cfg = read_json(path)
    known = NO_EFFECT | SIMULATED | set(NOT_SIMULATED)
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise InputError(path, unknown[0], f"not a DeepSpeed key zerosim knows; {allowed(sorted(known))}")
    for key, default in NOT_SIMULATED.items():
        if key in cfg and cfg[key] != default:
            raise InputError(path, key, f"{cfg[key]!r}: {NOT_SIMULATED_YET}; allowed: its default ({default!r})")
    _check_optimizer(cfg.get("optimizer"), path)
    ckpt = read_table(cfg.get("activation_checkpointing", {}), CHECKPOINT_KEYS, path, "activation_checkpointing.")
    zero_raw = cfg.get("zero_optimization", {})
    if isinstance(zero_raw, bool):  # deprecated form read_zero_config_deprecated
        zero_raw = {"stage": 1 if zero_raw else 0}
    precision = _precision(cfg, path)
    return DeepSpeedSettings(
        path=path,
        train_batch_size=_batch_key(cfg, "train_batch_size", path, L.MAX_BATCH),
        micro_batch=_batch_key(cfg, "train_micro_batch_size_per_gpu", path, L.MAX_MICRO_BATCH),
        grad_accum=_batch_key(cfg, "gradient_accumulation_steps", path, L.MAX_BATCH),
        precision=precision,
        gradient_clipping=check_value(cfg.get("gradient_clipping", 1.0),
                                      Key("gradient_clipping", float, non_negative=True),
                                      path, "gradient_clipping"),
        communication_data_type=_comm_dtype(cfg.get("communication_data_type"), precision, path),
        partition_activations=ckpt["partition_activations"],
        cpu_checkpointing=ckpt["cpu_checkpointing"],
        contiguous_memory_optimization=ckpt["contiguous_memory_optimization"],
        number_checkpoints=ckpt["number_checkpoints"],
        zero=replace(zero_from_dict(zero_raw, path, "zero_optimization.", hidden=hidden),
                     aio=read_aio(cfg.get("aio") or {}, path),
                     grad_accum_dtype=read_table(cfg.get("data_types") or {}, DATA_TYPES_KEYS, path,
                                                 "data_types.")["grad_accum_dtype"]),
        torch_adam=_torch_adam(cfg.get("optimizer"), path),
    )


Named = tuple[str | Path, str]   # (file, key as written there)


def resolve_batch(train_batch: int | None, micro: int | None, gas: int | None, dp: int,
                  names: tuple[Named, Named, Named]) -> tuple[int, int, int]:
    """DeepSpeed's fill-in rule (config.py `_set_batch_related_parameters`) -> (global,
    micro, accum), with global = micro * accum * dp enforced (`_batch_assertion`).

    `names` say where (global, micro, accum) were written: (file, key) each, so that a
    message names the ds_config.json key or the scenario key the user gave.
    """
    (g_src, g_key), (m_src, m_key), (a_src, a_key) = names
    given = f"{g_key}={train_batch}, {m_key}={micro}, {a_key}={gas} and data-parallel degree {dp}"
    if train_batch is not None and micro is not None and gas is not None:
        pass
    elif train_batch is not None and micro is not None:
        gas = train_batch // micro // dp
    elif train_batch is not None and gas is not None:
        micro = train_batch // dp // gas
    elif micro is not None and gas is not None:
        train_batch = micro * gas * dp
    elif train_batch is not None:
        gas, micro = 1, train_batch // dp
    elif micro is not None:
        gas, train_batch = 1, micro * dp
    else:
        raise InputError(g_src, g_key, f"either {g_key} or {m_key} needs to be provided; "
                         f"allowed: an integer > 0")
    for src, key, value in ((g_src, g_key, train_batch), (m_src, m_key, micro), (a_src, a_key, gas)):
        if value is None or value <= 0:
            raise InputError(src, key, f"got {value} from {given}; allowed: values that make all three "
                             f"> 0 with {g_key} = {m_key} * {a_key} * dp")
    assert train_batch is not None and micro is not None and gas is not None
    if train_batch != micro * gas * dp:
        raise InputError(g_src, g_key, f"{train_batch} != {m_key} ({micro}) * {a_key} ({gas}) "
                         f"* data-parallel degree ({dp}) = {micro * gas * dp}; allowed: "
                         f"{g_key} = {m_key} * {a_key} * dp")
    return train_batch, micro, gas


def _batch_key(cfg: Mapping[str, Any], key: str, path: Path, maximum: int) -> int | None:
    value = cfg.get(key)
    if value is None or value == "auto":
        return None
    return check_value(value, Key(key, int, positive=True, maximum=maximum), path, key)


def _precision(cfg: Mapping[str, Any], path: Path) -> str:
    """fp16.enabled / bf16.enabled (or its alias bfloat16); both on is DeepSpeed's error."""
    on = []
    for key, name in (("fp16", "fp16"), ("bf16", "bf16"), ("bfloat16", "bf16")):
        section = cfg.get(key, {})
        if not isinstance(section, Mapping):
            raise InputError(path, key, "expected an object such as {\"enabled\": true}")
        enabled = section.get("enabled", False)
        if enabled == "auto":
            raise InputError(path, f"{key}.enabled", "'auto' is filled in by the HF Trainer; "
                             "allowed: true, false")
        if check_value(enabled, Key("enabled", bool), path, f"{key}.enabled"):
            on.append(name)
    if len(on) > 1:
        raise InputError(path, "bf16.enabled", "fp16 and bf16 cannot both be enabled")
    return on[0] if on else "fp32"


def _comm_dtype(value: Any, precision: str, path: Path) -> str | None:
    """Gradient-reduction dtype; simulated when it is the training precision (DeepSpeed's
    default), refused otherwise until reductions in another dtype are simulated."""
    names = {"fp16": "fp16", "bfp16": "bf16", "bf16": "bf16", "fp32": "fp32"}
    if value is None:
        return None
    if not isinstance(value, str) or value not in names:
        raise InputError(path, "communication_data_type", f"{value!r}; {allowed(sorted(names))}")
    if names[value] != precision:
        raise InputError(path, "communication_data_type", f"{value!r} differs from the training precision "
                         f"({precision}): {NOT_SIMULATED_YET}; allowed: {precision} or leave it out")
    return names[value]


def _torch_adam(section: Any, path: Path) -> bool:
    """`optimizer.params.torch_adam` (DeepSpeed's Adam falls back to torch.optim.Adam)."""
    params = section.get("params", {}) if isinstance(section, Mapping) else {}
    if not isinstance(params, Mapping):
        raise InputError(path, "optimizer.params", f"expected an object, got {params!r}")
    value = params.get("torch_adam", False)
    return bool(check_value(value, Key("torch_adam", bool), path, "optimizer.params.torch_adam"))


def _check_optimizer(section: Any, path: Path) -> None:
    """The memory model assumes Adam-family state (fp32 m and v)."""
    if section is None:
        return
    if not isinstance(section, Mapping):
        raise InputError(path, "optimizer", f"expected an object such as {{\"type\": \"AdamW\"}}, got {section!r}")
    kind = section.get("type")
    if not isinstance(kind, str) or kind.lower() not in ADAM_LIKE:
        raise InputError(path, "optimizer.type", f"{kind!r} is {NOT_SIMULATED_YET}; allowed: Adam, AdamW")
