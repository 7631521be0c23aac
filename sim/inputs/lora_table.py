"""A scenario's `[lora]` table, with PEFT's LoraConfig names (peft/tuners/lora/config.py).

Simulated: `r` and `target_modules` (a list of module names or name suffixes, or
"all-linear"). Accepted and costing nothing in the simulator: `lora_alpha` (the adapter
output's scaling factor) and `lora_dropout` (a dropout on the adapter input: its kernel and
mask are not counted). Refused as not simulated yet: a `bias` other than "none",
`modules_to_save`, DoRA (`use_dora`) and rsLoRA's or other initialisations that change the
work, and LoRA with tensor or pipeline parallelism, with the Megatron-Core engine or the
paper schedules.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from sim.core.errors import InputError
from sim.core.model import LoraSpec, ModelSpec, module_tree
from sim.inputs.schema import NOT_SIMULATED_YET, Key, read_table

LORA_KEYS = (
    Key("r", int, positive=True, maximum=65_536),
    Key("target_modules", object),
    Key("lora_alpha", float, required=False, default=8.0, positive=True),      # scaling only: no cost
    Key("lora_dropout", float, required=False, default=0.0, non_negative=True, maximum=1.0),   # not counted
    Key("bias", str, required=False, default="none", choices=("none", "all", "lora_only")),
    Key("modules_to_save", list, required=False, default=[]),
    Key("use_dora", bool, required=False, default=False),
    Key("use_rslora", bool, required=False, default=False),    # a different scaling only: no cost
    Key("task_type", str, required=False, default="CAUSAL_LM", choices=("CAUSAL_LM",)),
)


def read_lora(raw: Mapping[str, Any], source: Path) -> LoraSpec:
    """Checked [lora] values as a LoraSpec (targets not yet matched against a model)."""
    v = read_table(raw, LORA_KEYS, source, "lora.")
    for key, default in (("bias", "none"), ("modules_to_save", []), ("use_dora", False)):
        if v[key] != default:
            raise InputError(source, f"lora.{key}", f"{v[key]!r}: {NOT_SIMULATED_YET}; allowed: {default!r}")
    targets = v["target_modules"]
    if isinstance(targets, str) and targets != "all-linear":   # PEFT: a string is a regex on the full name
        try:
            re.compile(targets)
        except re.error as error:
            raise InputError(source, "lora.target_modules", f"{targets!r} is not a regular expression ({error})")
        return LoraSpec(rank=v["r"], targets=(targets,), pattern=targets)
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) and t for t in targets):
        raise InputError(source, "lora.target_modules", f"{targets!r}: expected a non-empty list of module "
                         "names (\"q_proj\", \"v_proj\", ...) or \"all-linear\"")
    if "all-linear" in targets and len(targets) > 1:
        raise InputError(source, "lora.target_modules", "\"all-linear\" stands alone; allowed: it, or a list of names")
    return LoraSpec(rank=v["r"], targets=tuple(targets))


def with_lora(m: ModelSpec, lora: LoraSpec, source: Path) -> ModelSpec:
    """`m` with the adapters; every target must name a Linear inside the blocks (PEFT raises
    when a target matches nothing: "Target modules ... not found in the base model")."""
    linears = [mod.name for mod in module_tree(replace(m, layers=1)) if mod.kind == "linear"]
    outside = [name for name in linears if not name.startswith("model.layers.")]
    inside = [name.split(".", 3)[3] for name in linears if name.startswith("model.layers.")]
    choices = sorted({name.rsplit(".", 1)[-1] for name in inside})
    if lora.pattern is not None:
        if not any(re.fullmatch(lora.pattern, f"model.layers.0.{name}") for name in inside):
            raise InputError(source, "lora.target_modules", f"{lora.pattern!r} (a regular expression on the whole "
                             f"module name) matches no Linear of {m.name}'s blocks, e.g. model.layers.0.{inside[0]}")
        return replace(m, lora=lora)
    for target in lora.targets:
        if target == "all-linear":
            continue
        if any(name == target or name.endswith("." + target) for name in outside):
            raise InputError(source, "lora.target_modules", f"{target!r} (a LoRA adapter outside the transformer "
                             f"blocks): {NOT_SIMULATED_YET}; allowed: {', '.join(choices)}")
        if not any(name == target or name.endswith("." + target) for name in inside):
            raise InputError(source, "lora.target_modules", f"{target!r} matches no Linear of {m.name}; allowed: "
                             f"{', '.join(choices)}, or \"all-linear\"")
    return replace(m, lora=lora)
