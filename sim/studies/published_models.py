"""The model of a published row: an inline [model] table built from the shape columns
(shared/validation/README.md section 1: `ffn_hidden` is 4h unless the source says
otherwise), or, when a row names a model without its shape, a known published shape.

Styles, chosen from the model and other_config text:
- GPT (Megatron GPT, GPT-2/3, OPT, MT-NLG): learned positions, tied embeddings, LayerNorm,
  biases everywhere, plain 4h MLP (Megatron-LM `GPTModel`).
- BLOOM (ALiBi): as GPT but no position parameters (modelled as rope, which has none).
- GPT-NeoX: rotary positions, untied embeddings.
- Llama: SwiGLU, RMSNorm, no biases, rotary, untied; GQA from 'heads (n KV)'.
Megatron-based frameworks pad the vocabulary to a multiple of 128 x tp
(`--make-vocab-size-divisible-by 128`, Megatron-LM `_vocab_size_with_padding`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from sim.analytic.params import total_params
from sim.core.model import ModelSpec
from sim.studies.published_cells import Unusable, integer, number, quote, states_nothing

NOT_DECODERS = (r"\bt5\b", r"\bvit\b", r"deepvit", r"optimizer step", r"^n/a", r"hardware", r"\bbert\b")


def _mpt(layers: int, hidden: int, heads: int) -> dict[str, Any]:
    """MosaicML MPT (llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml): ALiBi, no biases,
    tied embeddings, expansion ratio 4, vocab_size 50368."""
    return {"family": "gpt2", "layers": layers, "hidden": hidden, "heads": heads, "kv_heads": heads,
            "ffn_hidden": 4 * hidden, "vocab": 50368, "gated_mlp": False, "tied_embeddings": True,
            "norm": "layernorm", "bias": "none", "position": "rope"}


def _qwen2(layers: int, hidden: int, heads: int, kv: int, ffn: int) -> dict[str, Any]:
    """Qwen2.5 (Hugging Face config.json): SwiGLU, RMSNorm, q/k/v biases, tied for <= 3B."""
    return {"family": "llama", "layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv,
            "ffn_hidden": ffn, "vocab": 151936, "gated_mlp": True, "tied_embeddings": True,
            "norm": "rmsnorm", "bias": "qkv", "position": "rope"}


# normalised model name -> a catalog model name or an inline table (only for rows without shape columns)
KNOWN_SHAPES: dict[str, str | dict[str, Any]] = {
    "mpt125m": _mpt(12, 768, 12), "mpt350m": _mpt(24, 1024, 16), "mpt760m": _mpt(24, 1536, 12),
    "mpt1b": _mpt(24, 2048, 16), "mpt3b": _mpt(32, 2560, 20), "mpt7b": _mpt(32, 4096, 32),
    "mpt13b": _mpt(40, 5120, 40), "mpt30b": _mpt(48, 7168, 56), "mpt70b": _mpt(80, 8192, 64),
    "qwen2515b": _qwen2(28, 1536, 12, 2, 8960), "qwen253b": _qwen2(36, 2048, 16, 2, 11008),
    "llama27b": "llama2-7b", "llama213b": "llama2-13b", "llama270b": "llama2-70b",
    "llama38b": "llama3-8b", "llama318b": "llama3-8b", "llama370b": "llama3-70b", "llama3170b": "llama3-70b",
    "llama3405b": "llama3-405b", "llama31405b": "llama3-405b", "mistral7b": "mistral-7b",
    "gpt3175b": "gpt3-175b", "gpt2": "gpt2", "gpt2medium": "gpt2-medium", "gpt2large": "gpt2-large",
    "gpt2xl": "gpt2-xl",
}


def normalised(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def known_shape(name: str) -> str | dict[str, Any] | None:
    return KNOWN_SHAPES.get(normalised(name))


def check_decoder(name: str) -> None:
    low = name.lower()
    if any(re.search(p, low) for p in NOT_DECODERS):
        raise Unusable(f"model {quote(name)} is not a decoder-only language model")


def padded_vocab(vocab: int, tp: int) -> int:
    """Megatron-LM's padding: a multiple of 128 x tp."""
    step = 128 * tp
    return math.ceil(vocab / step) * step


def _heads(text: str, notes: list[str]) -> tuple[int | None, int | None]:
    """'32 (8 KV)' -> (32, 8); '16' -> (16, 16)."""
    heads = integer(re.sub(r"\(\s*\d+\s*KV\s*\)", "", text, flags=re.I), "heads", notes)
    kv = re.search(r"(\d+)\s*KV", text, re.I)
    return heads, int(kv.group(1)) if kv else heads


def _vocab(f: Mapping[str, str], name: str, notes: list[str]) -> tuple[int, int]:
    """(stated V, V of the embedding): '250680 (padded 250880)' -> (250680, 250880). A GPT
    row without a vocabulary gets the GPT-2 BPE (50257), recorded."""
    text = f.get("vocab", "")
    stated = integer(text, "vocab", notes)
    if stated is None:
        if "gpt" not in name.lower():
            raise Unusable("vocab not given")
        notes.append("vocab not given: GPT-2 BPE 50257 assumed")
        return 50257, 50257
    padded = re.search(r"padded\s*(?:to\s*)?(\d+)", text, re.I)
    return stated, int(padded.group(1)) if padded else stated


def _style(name: str, other: str) -> dict[str, Any]:
    low, oc = name.lower(), other.lower()
    if "llama" in low:
        return {"family": "llama", "gated_mlp": True, "tied_embeddings": False, "norm": "rmsnorm",
                "bias": "none", "position": "rope"}
    gpt: dict[str, Any] = {"family": "gpt2", "gated_mlp": False, "tied_embeddings": True, "norm": "layernorm",
                           "bias": "all", "position": "learned"}
    if "bloom" in low or "alibi" in oc:
        gpt["position"] = "rope"
    if "neox" in low:
        gpt.update(position="rope", tied_embeddings=False)
    return gpt


def model_table(f: Mapping[str, str], seq: int, tp: int, megatron: bool,
                notes: list[str]) -> tuple[str | dict[str, Any], int]:
    """(the scenario's `model` value, the vocabulary the source's FLOP count used)."""
    name = " ".join(f.get("model", "").split()) or "unnamed"
    check_decoder(name)
    layers = integer(f.get("layers", ""), "layers", notes)
    hidden = integer(f.get("hidden", ""), "hidden", notes)
    heads, kv = _heads(f.get("heads", ""), notes)
    if layers is None or hidden is None or heads is None:
        return _named(name, f, layers, hidden, heads, notes)
    stated, vocab = _vocab(f, name, notes)
    if megatron and padded_vocab(vocab, tp) != vocab:
        notes.append(f"vocab {vocab} padded to {padded_vocab(vocab, tp)} (Megatron: a multiple of 128 x tp)")
        vocab = padded_vocab(vocab, tp)
    ffn = integer(f.get("ffn_hidden", ""), "ffn_hidden", notes)
    style = _style(name, f.get("other_config", ""))
    if ffn is None:
        if style["gated_mlp"]:
            raise Unusable("ffn_hidden not given for a gated-MLP model")
        ffn = 4 * hidden
    if style["position"] == "rope" and style["family"] == "gpt2" and "neox" not in name.lower():
        notes.append("ALiBi positions: no position parameters (modelled as rope)")
    table = {"name": name[:80], "layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv or heads,
             "ffn_hidden": ffn, "vocab": vocab, **style}
    if style["position"] == "learned":
        table["max_positions"] = seq
    return table, stated


def _named(name: str, f: Mapping[str, str], layers: int | None, hidden: int | None, heads: int | None,
           notes: list[str]) -> tuple[str | dict[str, Any], int]:
    """A row without a complete shape: a known published model of that name, else Unusable."""
    shape = known_shape(name)
    if shape is None:
        missing = [c for c, v in (("layers", layers), ("hidden", hidden), ("heads", heads)) if v is None]
        said = [quote(f.get(c, "")) for c in missing if not states_nothing(f.get(c, ""))]
        raise Unusable(f"model shape not given ({', '.join(missing)}{': ' + ', '.join(said) if said else ''})")
    if isinstance(shape, str):
        notes.append(f"shape of {quote(name)} from the catalog model {shape}")
        return shape, 0
    notes.append(f"shape of {quote(name)} from its published config (llm-foundry yaml / HF config.json)")
    table = {"name": name[:80], **shape}
    return table, int(table["vocab"])


def params_note(f: Mapping[str, str], m: ModelSpec) -> str | None:
    """A note when the row's params_B and the count from the shape differ by more than 5%."""
    stated = number(f.get("params_B", ""), "params_B", [])
    if stated is None:
        return None
    counted = total_params(m) / 1e9
    if abs(counted / stated - 1) <= 0.05:
        return None
    return f"params_B {stated:g} vs {counted:.1f}B counted from the shape ({100 * (counted / stated - 1):+.0f}%)"
