"""The model keys a file may give, their limits, and the rules a real implementation enforces.

Shared by the TOML reader (sim.inputs.models) and the Hugging Face config.json reader
(sim.inputs.hf_config), so that both refuse the same models with the same numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from sim.core import limits as L
from sim.core.errors import InputError
from sim.core.model import Bias, Family, ModelSpec, Norm, Position
from sim.inputs.schema import Key

MODEL_KEYS = (
    Key("name", str, required=False, default="inline model"),
    Key("family", str, required=False, default="llama", choices=tuple(Family)),
    Key("layers", int, positive=True, maximum=L.MAX_LAYERS),
    Key("hidden", int, positive=True, maximum=L.MAX_HIDDEN),
    Key("heads", int, positive=True, maximum=L.MAX_HEADS),
    Key("kv_heads", int, positive=True, maximum=L.MAX_HEADS),
    Key("head_dim", int, required=False, default=None, positive=True, maximum=L.MAX_HEAD_DIM),
    Key("ffn_hidden", int, positive=True, maximum=L.MAX_FFN_HIDDEN),
    Key("vocab", int, positive=True, maximum=L.MAX_VOCAB),
    Key("gated_mlp", bool, required=False, default=True),
    Key("tied_embeddings", bool, required=False, default=False),
    Key("norm", str, required=False, default="rmsnorm", choices=tuple(Norm)),
    Key("bias", str, required=False, default="none", choices=tuple(Bias)),
    Key("position", str, required=False, default="rope", choices=tuple(Position)),
    Key("max_positions", int, required=False, default=0, non_negative=True, maximum=L.MAX_POSITIONS),
    Key("experts", int, required=False, default=1, positive=True, maximum=L.MAX_EXPERTS),
    Key("experts_per_token", int, required=False, default=1, positive=True, maximum=L.MAX_EXPERTS),
)



def check_model(m: ModelSpec, source: str | Path, prefix: str = "",
                names: Mapping[str, str] | None = None) -> None:
    """Consistency rules a real implementation would also enforce. `names` maps our key
    names to the ones the user wrote (an HF config.json's), for the messages."""
    def key(name: str) -> str:
        return prefix + (names or {}).get(name, name)
    if m.kv_heads > m.heads or m.heads % m.kv_heads:
        raise InputError(source, key("kv_heads"), f"{m.kv_heads} does not divide the {m.heads} attention "
                         f"heads; allowed: a divisor of {m.heads}")
    if m.position is Position.LEARNED and m.max_positions <= 0:
        raise InputError(source, key("max_positions"), "must be > 0 when position = 'learned'")
    if m.experts_per_token > m.experts:
        raise InputError(source, key("experts_per_token"),
                         f"{m.experts_per_token} > experts ({m.experts}); allowed: 1..{m.experts}")
    if (m.family is Family.MIXTRAL) != (m.experts > 1):
        raise InputError(source, key("experts"),
                         "family 'mixtral' needs experts > 1, and experts > 1 needs family 'mixtral'")
    if m.family is Family.GPT2 and m.gated_mlp:
        raise InputError(source, key("gated_mlp"), "family 'gpt2' has a plain (non-gated) MLP")
