"""Hugging Face `config.json` files, read the way transformers reads them.

Field names and defaults are those of transformers' `configuration_<type>.py` (llama,
mistral, qwen2, mixtral, gpt2): `num_key_value_heads` null or absent means as many as the
attention heads, `head_dim` null or absent means hidden_size / num_attention_heads, GPT-2's
`n_inner` null means 4 x n_embd, GPT-2 ties its embeddings unless told otherwise. Each value
is checked with the limits of the matching model key (sim.inputs.model_rules), and every message
names the key as the file spells it. Fields that do not shape the parameters or the work
(token ids, dropout, initialisation, dtype) are not read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sim.core.errors import InputError, allowed
from sim.core.model import Bias, Family, ModelSpec, Norm, Position
from sim.inputs.model_rules import MODEL_KEYS, check_model
from sim.inputs.schema import Key, check_value, describe

HF_TYPES = ("llama", "mistral", "qwen2", "gpt2", "mixtral")
# our key -> the config.json field, per architecture
LLAMA_NAMES = {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
               "kv_heads": "num_key_value_heads", "head_dim": "head_dim", "ffn_hidden": "intermediate_size",
               "vocab": "vocab_size", "tied_embeddings": "tie_word_embeddings",
               "experts": "num_local_experts", "experts_per_token": "num_experts_per_tok"}
GPT2_NAMES = {"layers": "n_layer", "hidden": "n_embd", "heads": "n_head", "ffn_hidden": "n_inner",
              "vocab": "vocab_size", "max_positions": "n_positions", "tied_embeddings": "tie_word_embeddings",
              "kv_heads": "n_head"}
_KEYS = {k.name: k for k in MODEL_KEYS}


def model_from_hf_config(cfg: Mapping[str, Any], source: str | Path) -> ModelSpec:
    """An HF config.json (llama, mistral, qwen2, gpt2, mixtral) -> ModelSpec."""
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or model_type not in HF_TYPES:
        raise InputError(source, "model_type", f"{model_type!r} is not supported; {allowed(HF_TYPES)}")
    name = cfg.get("_name_or_path")
    name = name if isinstance(name, str) and name else Path(source).stem
    if model_type == "gpt2":
        return _gpt2(cfg, source, name)
    return _llama_like(cfg, source, name, model_type)


def _llama_like(cfg: Mapping[str, Any], source: str | Path, name: str, model_type: str) -> ModelSpec:
    get = _reader(cfg, source, LLAMA_NAMES)
    hidden, heads = get("hidden"), get("heads")
    is_moe = model_type == "mixtral"
    spec = ModelSpec(
        name=name, family=Family.MIXTRAL if is_moe else Family.LLAMA, layers=get("layers"),
        hidden=hidden, heads=heads, kv_heads=get("kv_heads", default=heads),
        head_dim=get("head_dim", default=_head_dim(hidden, heads, source, LLAMA_NAMES)),
        ffn_hidden=get("ffn_hidden"), vocab=get("vocab"), gated_mlp=True,
        tied_embeddings=get("tied_embeddings", default=False), norm=Norm.RMSNORM,
        bias=_llama_bias(cfg, model_type, source), position=Position.ROPE, max_positions=0,
        experts=get("experts") if is_moe else 1, experts_per_token=get("experts_per_token") if is_moe else 1)
    check_model(spec, source, names=LLAMA_NAMES)
    return spec


def _gpt2(cfg: Mapping[str, Any], source: str | Path, name: str) -> ModelSpec:
    """GPT2Config: n_embd, n_layer, n_head, n_inner (null -> 4 n_embd), n_positions; tied."""
    get = _reader(cfg, source, GPT2_NAMES)
    hidden, heads = get("hidden"), get("heads")
    spec = ModelSpec(name=name, family=Family.GPT2, layers=get("layers"), hidden=hidden, heads=heads,
                     kv_heads=heads, head_dim=_head_dim(hidden, heads, source, GPT2_NAMES),
                     ffn_hidden=get("ffn_hidden", default=4 * hidden), vocab=get("vocab"), gated_mlp=False,
                     tied_embeddings=get("tied_embeddings", default=True), norm=Norm.LAYERNORM,
                     bias=Bias.ALL, position=Position.LEARNED, max_positions=get("max_positions"))
    check_model(spec, source, names=GPT2_NAMES)
    return spec


def _reader(cfg: Mapping[str, Any], source: str | Path, names: Mapping[str, str]):  # noqa: ANN202
    """get(our_key, default=...) -> the checked value of the HF field for `our_key`; a
    missing or null field takes the default, or is an error when there is none."""
    required = object()

    def get(key: str, default: Any = required) -> Any:
        field = names[key]
        value = cfg.get(field)
        if value is None:
            if default is required:
                raise InputError(source, field, f"missing; allowed: {describe(_KEYS[key])}")
            return default
        return check_value(value, dataclasses.replace(_KEYS[key], name=field), source, field)
    return get


def _head_dim(hidden: int, heads: int, source: str | Path, names: Mapping[str, str]) -> int:
    if hidden % heads:
        raise InputError(source, names["heads"], f"{heads} does not divide the hidden size {hidden}; "
                         f"allowed: a divisor of {hidden}, or give head_dim")
    return hidden // heads


def _llama_bias(cfg: Mapping[str, Any], model_type: str, source: str | Path) -> Bias:
    """Qwen2 always has q/k/v bias; Llama has `attention_bias` (all four projections)."""
    for field in ("mlp_bias", "attention_bias"):
        if field in cfg and cfg[field] is not None:
            check_value(cfg[field], Key(field, bool), source, field)
    if cfg.get("mlp_bias"):
        raise InputError(source, "mlp_bias", "MLP biases are not simulated yet; allowed: false")
    if model_type == "qwen2":
        return Bias.QKV
    if cfg.get("attention_bias"):
        raise InputError(source, "attention_bias",
                         "Llama attention_bias (bias on q, k, v and o) is not simulated yet; allowed: false")
    return Bias.NONE
