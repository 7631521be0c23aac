"""The measured step time of a published row (shared/validation/README.md sections 3 and 7:
"compare the simulator's iteration time against the implied iteration time").

Preference: an explicit iteration time, then an implied one in the `derived` column, then
a conversion of the throughput with the FLOP count the source used:
- Megatron "achieved TFLOP/s per GPU", SC21 Eq. 3: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)),
  96 because it counts the recompute forward; 72 (Korthikanti's model FLOPs) when the row
  recomputes nothing or says it counts model FLOPs. DeepSpeed's unstated "TFLOPS per GPU"
  is read the same way (Megatron-DeepSpeed `throughput_calculator`: 96 with
  --checkpoint-activations, else 72).
- MFU / HFU (Korthikanti et al. 2022): model FLOPs / (t N peak), peak = the GPU's dense peak.
- llm-foundry MFU: (6 P s + 12 l h s^2) per sequence (it counts attention FLOPs).
- tokens/s/GPU: t = GBS s / (tps N) (samples/s: t = GBS / rate).
"""

from __future__ import annotations

import re
from enum import StrEnum

from sim.analytic.params import total_params
from sim.core.model import ModelSpec
from sim.inputs.scenario import Scenario
from sim.studies.published_cells import Unusable, quote


class Kind(StrEnum):
    TIME = "iteration time"
    DERIVED = "implied iteration time"
    TFLOPS = "TFLOP/s per GPU"
    PFLOPS = "aggregate PFLOP/s"
    TOKENS_GPU = "tokens/s per GPU"
    TOKENS_JOB = "tokens/s"
    SAMPLES_GPU = "samples/s per GPU"
    SAMPLES_JOB = "samples/s"
    MFU = "MFU"
    HFU = "HFU"


NOT_A_STEP = ("memory", "model size", "latency", "bandwidth", "speedup", "slowdown", "efficiency",
              "backward", "forward", "oom", "ratio")
_DERIVED = re.compile(r"implied (?:iteration|step) time\s*(?:=|~=|≈|of)?\s*~?([\d.]+)\s*(ms|s)\b", re.I)


def classify(metric: str, unit: str, derived: str) -> Kind:
    """What kind of number the row holds, or Unusable when it is no step time or throughput."""
    m, u = metric.lower(), unit.lower().replace(" ", "")
    if any(w in m for w in ("iteration time", "step time", "step_time", "time per iteration")) and u in ("s", "ms"):
        return Kind.TIME
    if any(w in m for w in NOT_A_STEP):
        return _not_a_step(metric)
    if _DERIVED.search(derived):
        return Kind.DERIVED
    if u.startswith("tflop"):
        return Kind.TFLOPS
    if u.startswith("pflop"):
        return Kind.PFLOPS
    if u.startswith(("tokens/s", "tok/s")):
        return Kind.TOKENS_GPU if u.endswith("/gpu") else Kind.TOKENS_JOB
    if u.startswith(("samples/s", "seq/s", "seqs/s", "sequences/s")):
        return Kind.SAMPLES_GPU if u.endswith("/gpu") else Kind.SAMPLES_JOB
    if u == "%" and "mfu" in m:
        return Kind.MFU
    if u == "%" and "hfu" in m:
        return Kind.HFU
    return _not_a_step(metric)


def _not_a_step(metric: str) -> Kind:
    raise Unusable(f"metric {quote(metric)} is not a step time or a throughput")


def explicit_time(kind: Kind, value: float, unit: str, derived: str) -> float | None:
    """Seconds, when the row states the step time itself (metric or `derived`)."""
    if kind is Kind.TIME:
        return value / 1000 if unit.strip().lower() == "ms" else value
    if kind is Kind.DERIVED:
        m = _DERIVED.search(derived)
        assert m is not None
        t = float(m.group(1))
        return t / 1000 if m.group(2).lower() == "ms" else t
    return None


def megatron_flops(m: ModelSpec, batch: int, seq: int, *, vocab: int | None = None, layer_passes: int = 4) -> float:
    """FLOPs of one iteration as Megatron counts them, generalised to GQA, gated MLPs and
    any FFN width: per token and layer 2h(q + 2kv) + 2qh (projections) + 4sq (scores and
    values) + 2hf x (3 gated | 2) (MLP), times `layer_passes` (3: forward + backward;
    4: plus the recompute forward); the logits 2hV, three passes. For a GPT block
    (q = kv = h, f = 4h) this is SC21 Eq. 3 with 4 passes, 96 B s l h^2 (1 + s/(6h) +
    V/(16 l h)), and Korthikanti's model FLOPs with 3, 72 B s l h^2 (1 + s/(6h) + V/(12 l h))."""
    h, q, kv = m.hidden, m.q_dim, m.kv_dim
    mlp = 2 * h * m.ffn_hidden * (3 if m.gated_mlp else 2) * m.experts_per_token
    layer = 2 * h * (q + 2 * kv) + 2 * q * h + 4 * seq * q + mlp
    logits = 2 * h * (vocab or m.vocab)
    return float(batch) * seq * (layer_passes * m.layers * layer + 3 * logits)


def llm_foundry_flops(m: ModelSpec, batch: int, seq: int) -> float:
    """llm-foundry's MFU numerator (scripts/train/benchmarking/README.md): per sequence
    3 (2 P s) + 3 (4 l h s^2), P every parameter."""
    return float(batch) * (6 * total_params(m) * seq + 12 * m.layers * m.hidden * seq**2)


def flop_passes(definition: str, recompute: str, notes: list[str]) -> int:
    """Layer passes counted by a TFLOP/s figure: 4 when the source's definition names the
    96 coefficient or counting recompute, 3 when it names 72 or model FLOPs; otherwise
    Megatron-DeepSpeed's throughput_calculator rule (4 with full recompute, else 3)."""
    d = definition.lower()
    if re.search(r"\b96\b", d) or "counts recompute" in d:
        return 4
    if re.search(r"\b72\b", d) or "model tflop" in d or "model flop" in d:
        return 3
    passes = 4 if recompute == "full" else 3
    notes.append(f"TFLOP/s counting not stated: Megatron-DeepSpeed throughput_calculator assumed "
                 f"(Eq. 3 with coefficient {24 * passes})")
    return passes


def converted_time(kind: Kind, value: float, definition: str, s: Scenario, vocab: int,
                   notes: list[str]) -> float:
    """Seconds per step implied by a throughput, with the model, batch and GPUs of `s`."""
    t, m, n = s.training, s.model, s.world_size
    batch, seq = t.global_batch, t.seq_len
    if kind in (Kind.TOKENS_GPU, Kind.TOKENS_JOB, Kind.SAMPLES_GPU, Kind.SAMPLES_JOB):
        each_gpu = kind in (Kind.TOKENS_GPU, Kind.SAMPLES_GPU)
        tokens = kind in (Kind.TOKENS_GPU, Kind.TOKENS_JOB)
        notes.append(f"step time = global_batch{' x seq_len' if tokens else ''} / ({kind.value}"
                     f"{' x GPUs' if each_gpu else ''})")
        return batch * (seq if tokens else 1) / (value * (n if each_gpu else 1))
    peak = s.cluster.gpu.peak_flops(t.precision.value)
    if kind in (Kind.MFU, Kind.HFU):
        if "llm-foundry" in definition.lower():
            flops = llm_foundry_flops(m, batch, seq)
            notes.append("llm-foundry MFU (6 P s + 12 l h s^2 per sequence) used to turn MFU into step time")
        else:
            passes = 4 if kind is Kind.HFU and t.recompute.value == "full" else 3
            flops = megatron_flops(m, batch, seq, vocab=vocab, layer_passes=passes)
            notes.append(f"Korthikanti {kind.value} (coefficient {24 * passes}) with the GPU's dense peak "
                         f"{peak / 1e12:g} TFLOP/s used to turn {kind.value} into step time")
        return flops / (value / 100 * n * peak)
    per_gpu = value * 1e12 if kind is Kind.TFLOPS else value * 1e15 / n
    passes = flop_passes(definition, t.recompute.value, notes)
    notes.append(f"Megatron Eq. 3 family (coefficient {24 * passes}, V = {vocab}) used to turn TFLOP/s into step time")
    return megatron_flops(m, batch, seq, vocab=vocab, layer_passes=passes) / (per_gpu * n)
