"""Model catalog loading: model TOML files, inline [model] tables, HF config.json files.

TOML keys (docs/scenarios.md, "Model files"): `layers`, `hidden`, `heads`, `kv_heads`,
`ffn_hidden`, `vocab` are required; `name`, `family`, `head_dim`, `gated_mlp`,
`tied_embeddings`, `norm`, `bias`, `position`, `max_positions`, `experts`,
`experts_per_token` are optional with Llama-like defaults. HF `config.json` is read the
way transformers reads it (field names and defaults of `configuration_<type>.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sim.core.errors import InputError
from sim.core.model import Bias, Family, ModelSpec, Norm, Position
from sim.inputs.catalog import resolve
from sim.inputs.hf_config import model_from_hf_config
from sim.inputs.model_rules import MODEL_KEYS, check_model
from sim.inputs.reading import read_json, read_toml
from sim.inputs.schema import read_table


def load_model(ref: str | Mapping[str, Any], base_dir: Path, source: str | Path,
               key: str = "model") -> ModelSpec:
    """A catalog name, a .toml / config.json path, or an inline table -> ModelSpec."""
    if isinstance(ref, Mapping):
        return model_from_table(ref, source, key + ".")
    if not isinstance(ref, str):
        raise InputError(source, key, "expected a model catalog name, a path or a [model] table")
    path = resolve(ref, "models", base_dir, source, key)
    if path.suffix == ".json":
        return model_from_hf_config(read_json(path), path)
    return model_from_table(read_toml(path), path)


def model_from_table(table: Mapping[str, Any], source: str | Path, prefix: str = "") -> ModelSpec:
    v = read_table(table, MODEL_KEYS, source, prefix)
    if v["head_dim"] is None:
        if v["hidden"] % v["heads"]:
            raise InputError(source, prefix + "heads", f"hidden ({v['hidden']}) is not divisible "
                             f"by heads ({v['heads']}); give head_dim explicitly")
        v["head_dim"] = v["hidden"] // v["heads"]
    spec = ModelSpec(name=v["name"], family=Family(v["family"]), layers=v["layers"],
                     hidden=v["hidden"], heads=v["heads"], kv_heads=v["kv_heads"],
                     head_dim=v["head_dim"], ffn_hidden=v["ffn_hidden"], vocab=v["vocab"],
                     gated_mlp=v["gated_mlp"], tied_embeddings=v["tied_embeddings"],
                     norm=Norm(v["norm"]), bias=Bias(v["bias"]), position=Position(v["position"]),
                     max_positions=v["max_positions"], experts=v["experts"],
                     experts_per_token=v["experts_per_token"])
    check_model(spec, source, prefix)
    return spec
