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

from sim.catalog import resolve
from sim.errors import InputError, allowed
from sim.model import Bias, Family, ModelSpec, Norm, Position
from sim.schema import Key, read_json, read_table, read_toml

MODEL_KEYS = (
    Key("name", str, required=False, default="inline model"),
    Key("family", str, required=False, default="llama", choices=tuple(Family)),
    Key("layers", int, positive=True),
    Key("hidden", int, positive=True),
    Key("heads", int, positive=True),
    Key("kv_heads", int, positive=True),
    Key("head_dim", int, required=False, default=None, positive=True),
    Key("ffn_hidden", int, positive=True),
    Key("vocab", int, positive=True),
    Key("gated_mlp", bool, required=False, default=True),
    Key("tied_embeddings", bool, required=False, default=False),
    Key("norm", str, required=False, default="rmsnorm", choices=tuple(Norm)),
    Key("bias", str, required=False, default="none", choices=tuple(Bias)),
    Key("position", str, required=False, default="rope", choices=tuple(Position)),
    Key("max_positions", int, required=False, default=0, non_negative=True),
    Key("experts", int, required=False, default=1, positive=True),
    Key("experts_per_token", int, required=False, default=1, positive=True),
)
HF_TYPES = ("llama", "mistral", "qwen2", "gpt2", "mixtral")


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


def check_model(m: ModelSpec, source: str | Path, prefix: str = "") -> None:
    """Consistency rules a real implementation would also enforce."""
    if m.heads % m.kv_heads:
        raise InputError(source, prefix + "kv_heads",
                         f"heads ({m.heads}) must be a multiple of kv_heads ({m.kv_heads})")
    if m.position is Position.LEARNED and m.max_positions <= 0:
        raise InputError(source, prefix + "max_positions", "must be > 0 when position = 'learned'")
    if m.experts_per_token > m.experts:
        raise InputError(source, prefix + "experts_per_token",
                         f"{m.experts_per_token} > experts ({m.experts})")
    if (m.family is Family.MIXTRAL) != (m.experts > 1):
        raise InputError(source, prefix + "experts",
                         "family 'mixtral' needs experts > 1, and experts > 1 needs family 'mixtral'")
    if m.family is Family.GPT2 and m.gated_mlp:
        raise InputError(source, prefix + "gated_mlp", "family 'gpt2' has a plain (non-gated) MLP")


def model_from_hf_config(cfg: Mapping[str, Any], source: str | Path) -> ModelSpec:
    """Read an HF config.json (llama, mistral, qwen2, gpt2, mixtral) as transformers does."""
    model_type = cfg.get("model_type")
    if model_type not in HF_TYPES:
        raise InputError(source, "model_type", f"{model_type!r} is not supported; {allowed(HF_TYPES)}")
    name = str(cfg.get("_name_or_path") or Path(source).stem)
    if model_type == "gpt2":
        return _gpt2_from_hf(cfg, source, name)
    need = _hf_getter(cfg, source)
    heads = need("num_attention_heads")
    hidden = need("hidden_size")
    kv = cfg.get("num_key_value_heads") or heads
    is_moe = model_type == "mixtral"
    spec = ModelSpec(
        name=name, family=Family.MIXTRAL if is_moe else Family.LLAMA,
        layers=need("num_hidden_layers"), hidden=hidden, heads=heads, kv_heads=kv,
        head_dim=cfg.get("head_dim") or hidden // heads, ffn_hidden=need("intermediate_size"),
        vocab=need("vocab_size"), gated_mlp=True,
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)), norm=Norm.RMSNORM,
        bias=_hf_bias(cfg, model_type, source), position=Position.ROPE, max_positions=0,
        experts=need("num_local_experts") if is_moe else 1,
        experts_per_token=need("num_experts_per_tok") if is_moe else 1)
    check_model(spec, source)
    return spec


def _gpt2_from_hf(cfg: Mapping[str, Any], source: str | Path, name: str) -> ModelSpec:
    """GPT2Config: n_embd, n_layer, n_head, n_inner (None -> 4 n_embd), n_positions; tied."""
    need = _hf_getter(cfg, source)
    hidden = need("n_embd")
    heads = need("n_head")
    spec = ModelSpec(name=name, family=Family.GPT2, layers=need("n_layer"), hidden=hidden,
                     heads=heads, kv_heads=heads, head_dim=hidden // heads,
                     ffn_hidden=cfg.get("n_inner") or 4 * hidden, vocab=need("vocab_size"),
                     gated_mlp=False, tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
                     norm=Norm.LAYERNORM, bias=Bias.ALL, position=Position.LEARNED,
                     max_positions=need("n_positions"))
    check_model(spec, source)
    return spec


def _hf_bias(cfg: Mapping[str, Any], model_type: str, source: str | Path) -> Bias:
    """Qwen2 always has q/k/v bias; Llama has `attention_bias` (all four projections)."""
    if cfg.get("mlp_bias"):
        raise InputError(source, "mlp_bias", "MLP biases are not modelled; allowed: false")
    if model_type == "qwen2":
        return Bias.QKV
    if cfg.get("attention_bias"):
        raise InputError(source, "attention_bias",
                         "Llama attention_bias (bias on q, k, v and o) is not modelled; allowed: false")
    return Bias.NONE


def _hf_getter(cfg: Mapping[str, Any], source: str | Path):  # noqa: ANN202
    def need(key: str) -> int:
        value = cfg.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise InputError(source, key, f"missing or not a positive integer (got {value!r})")
        return value
    return need
