"""Published training measurements as simulator scenarios with a measured step time
(shared/validation/README.md), for predicted-vs-published error and for fitting.

`read_rows(path)` reads either table (detected by its header): the 39-column
`published-calibration.csv` or the 17-column `published-fsdp-offload.csv`, whose rows are
first rewritten into the 39-column vocabulary (`simple_fields`). Each row becomes a
`PublishedRow`: a Scenario and the measured step in seconds, or one line saying why the
row cannot be used; every guess made on the way is in `assumptions`.

The mapping is rule-based on the cells (sim.studies.published_cells, _layout, _models,
_targets document each rule); a row never raises: the simulator's own `InputError`
(scenario_from_table, then the engine's checks) becomes the reason.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.core.errors import InputError, one_line
from sim.engines.plan import model_of
from sim.engines.workload import float8_tp
from sim.inputs.load import scenario_from_table
from sim.inputs.reading import read_text
from sim.inputs.scenario import Scenario
from sim.studies import published_layout as lay
from sim.studies import published_micro
from sim.studies import published_network as net
from sim.studies.published_cells import (
    Reliability,
    Unusable,
    float8_linears,
    integer,
    plain_int,
    precision,
    quote,
    recompute,
    required_int,
    short_source,
    tier,
    value_of,
)
from sim.studies.published_context import with_stated_context
from sim.studies.published_models import model_table, params_note
from sim.studies.published_targets import Kind, classify, converted_time, explicit_time


@dataclass(frozen=True)
class PublishedRow:
    """One published measurement, as the simulator sees it."""

    id: str
    source: str            # short name of the publication
    confidence: str        # high | medium | low (the table's)
    value_kind: str        # table_exact, plot_readoff_approx (+/-x), ...
    tier: str              # A | B | C (README section 5; sim.studies.published_cells.tier)
    metric: str
    model: str
    scenario: Scenario | None
    measured_step_s: float | None
    reason: str            # "" when usable, else one line
    assumptions: tuple[str, ...]
    # with an unstated micro-batch: every micro-batch that fits, `scenario` among them; the
    # prediction is the fastest (sim.studies.published_micro)
    alternatives: tuple[Scenario, ...] = ()

    @property
    def usable(self) -> bool:
        return self.scenario is not None and self.measured_step_s is not None and not self.reason


def read_rows(path: str | Path) -> list[PublishedRow]:
    """Every row of a published-measurement CSV (either format), in file order."""
    path = Path(path)
    reader = csv.DictReader(io.StringIO(read_text(path)))
    header = set(reader.fieldnames or ())
    if {"fsdp_or_zero", "global_batch_tokens"} <= header:
        seen: dict[str, int] = {}
        rows = []
        for raw in reader:
            key = (raw.get("source") or "row").strip()
            seen[key] = seen.get(key, 0) + 1
            rows.append(row_from_fields(simple_fields(raw, seen[key])))
        return rows
    if {"id", "metric", "value", "framework"} <= header:
        return [row_from_fields({k: (v or "") for k, v in raw.items() if k}) for raw in reader]
    raise InputError(path, "header", "neither the published-calibration (id, ..., metric, value) nor the "
                     "fsdp-offload (source, ..., fsdp_or_zero, global_batch_tokens) columns")


def row_from_fields(f: Mapping[str, str]) -> PublishedRow:
    """A row of the 39-column table -> PublishedRow; never raises."""
    notes: list[str] = []
    scenario, step, reason = None, None, ""
    alternatives: tuple[Scenario, ...] = ()
    try:
        scenario, step, alternatives = _build(f, notes)
    except _WithStep as e:
        reason, step = str(e), e.step
    except (Unusable, InputError) as e:
        reason = str(e)
    except Exception as e:  # a bad row must not stop the others
        reason = f"not mapped ({type(e).__name__}: {e})"
    return PublishedRow(
        id=f.get("id", "") or "?", source=short_source(f.get("source", ""), f.get("source_url", "")),
        confidence=f.get("confidence", ""), value_kind=f.get("value_kind", ""), tier=_tier(f),
        metric=f.get("metric", ""), model=" ".join(f.get("model", "").split()), scenario=scenario,
        measured_step_s=step, reason=one_line(" ".join(reason.split())),
        assumptions=tuple(dict.fromkeys(one_line(n) for n in notes)), alternatives=alternatives)


def _tier(f: Mapping[str, str]) -> str:
    complete = all(plain_int(f.get(c, "")) for c in ("tp", "pp", "micro_batch", "global_batch"))
    return tier(Reliability(f.get("confidence", ""), f.get("value_kind", ""), complete))


def _build(f: Mapping[str, str], notes: list[str]) -> tuple[Scenario, float, tuple[Scenario, ...]]:
    """The scenario, measured step and micro-batch alternatives of a row, or Unusable /
    InputError."""
    kind = classify(f.get("metric", ""), f.get("unit", ""), f.get("derived", ""))
    value = value_of(f.get("value", ""))
    step = explicit_time(kind, value, f.get("unit", ""), f.get("derived", ""))
    if kind is Kind.DERIVED:
        notes.append(f"measured step from the derived column: {quote(f.get('derived', ''), 80)}")
    try:
        s, vocab, alternatives = _scenarios(f, notes)
    except (Unusable, InputError) as e:
        raise _WithStep(str(e), step) from None
    network = f.get("inter_node_bw", "")
    if step is None:
        step = converted_time(kind, value, f.get("metric_definition", ""), s, vocab or s.model.vocab, notes)
    if "inter_node_bw" in f and net.network_unknown(network, s) and (why := net.undetermined_reason(s, step)):
        raise _WithStep(why, step)
    return s, step, alternatives


def scenario_of(f: Mapping[str, str], notes: list[str]) -> tuple[Scenario, int]:
    """The scenario a row describes (on its stated network; an unstated Megatron
    micro-batch as 1) and the vocabulary its FLOP count used, whatever its metric;
    Unusable or InputError when it cannot be expressed."""
    table, vocab, _ = _table(f, notes)
    return _scenario(f, table, notes), vocab


def _scenarios(f: Mapping[str, str], notes: list[str]) -> tuple[Scenario, int, tuple[Scenario, ...]]:
    """scenario_of, with an unstated Megatron micro-batch chosen as the fastest that fits
    (sim.studies.published_micro), and the micro-batches that fit."""
    table, vocab, micros = _table(f, notes)
    s = _scenario(f, table, notes)
    if len(micros) <= 1:
        if micros:
            notes.append(f"micro_batch 1 assumed (the row does not give it; no larger power of two divides its "
                         f"{s.training.global_batch // s.parallel.dp} sequences per data-parallel rank)")
        return s, vocab, ()
    variants = [s] + [_scenario(f, _with_micro(table, m), []) for m in micros[1:]]
    chosen, fitting = published_micro.fastest(variants, notes)
    return chosen, vocab, fitting


def _scenario(f: Mapping[str, str], table: dict[str, Any], notes: list[str]) -> Scenario:
    s = scenario_from_table(table, Path("published") / (f.get("id") or "row"), f.get("id") or "row")
    model_of(s)   # the engine's own checks (e.g. FSDP2 with tp > 1)
    if note := params_note(f, s.model):
        notes.append(note)
    if s.parallel.tp > 1 and float8_tp(s):
        notes.append("torchtitan's float8 TP styles: TP all-gathers in fp8, reduce-scatters in bf16")
    return net.apply_stated(f.get("inter_node_bw", ""), s, notes)


def _with_micro(table: dict[str, Any], micro_batch: int) -> dict[str, Any]:
    return {**table, "training": {**table["training"], "micro_batch": micro_batch}}


class _WithStep(Unusable):
    """Unusable, keeping the measured step when the row states it."""

    def __init__(self, reason: str, step: float | None) -> None:
        super().__init__(reason)
        self.step = step


def _table(f: Mapping[str, str], notes: list[str]) -> tuple[dict[str, Any], int, list[int]]:
    """The scenario table of a row (docs/scenarios.md), the vocabulary its FLOP count used
    and, when the row leaves a Megatron micro-batch unstated, the micro-batches to try."""
    f = with_stated_context(f, notes)
    row_gpn = lay.row_gpus_per_node(f.get("gpus_per_node", ""), notes)
    cluster = lay.cluster_name(f.get("gpu", ""), row_gpn, notes)
    cluster_gpn = lay.catalog_cluster(cluster).gpus_per_node
    layout = lay.layout(f, cluster_gpn, row_gpn, notes)
    choice = lay.engine(f, layout.nodes, layout.gpus_per_node, notes, layout.tp)
    seq = required_int(f.get("seq_len", ""), "seq_len", notes)
    model, vocab = model_table(f, seq, layout.tp, choice.megatron, notes)
    prec = precision(f.get("precision", ""), notes)
    rec = recompute(f.get("act_ckpt", ""), notes)
    micro, glob, micro_assumed = lay.batch(f, seq, layout.dp, choice.megatron, notes)
    chunks = _schedule_notes(f, layout.pp, choice.family == "megatron", notes)
    parallel: dict[str, Any] = {"tp": layout.tp, "pp": layout.pp,
                                **lay.stage_split(f, model["layers"] if isinstance(model, dict) else 0, layout.pp, notes)}
    if chunks > 1:
        parallel["virtual_stages"] = chunks
    torchtitan = bool(re.search(r"torchtitan", f.get("framework", "").lower()))
    if layout.tp > 1 and (_sequence_parallel(f) or choice.keys.get("megatron", {}).get("tp_comm_overlap")
                          or torchtitan):
        # Megatron asserts it under --tp-comm-overlap; torchtitan's TP plan shards the norms
        # (SequenceParallel on attention_norm, ffn_norm and norm: parallelize_llama.py)
        parallel["sequence_parallel"] = True
    training: dict[str, Any] = {"seq_len": seq, "micro_batch": micro, "global_batch": glob,
                                "precision": prec, "recompute": rec}
    if choice.partition_activations:
        training["partition_activations"] = True
    if torchtitan:
        training["optimizer_implementation"] = "fused"    # torchtitan's optimizer.implementation default
        notes.append("Adam fused (torchtitan's default optimizer.implementation)")
        if rec == "selective":        # its selective mode: selective_ac_option = "op" in its Llama configs
            training["recompute"] = "selective-op"
            notes.append("selective recompute as torchtitan's per-op policy (selective_ac_option 'op')")
        if layout.pp > 1 and choice.family == "fsdp":
            # torchtitan's reshard_after_forward policy "default" is `not pp_enabled`
            choice.keys.setdefault("fsdp", {})["reshard_after_forward"] = False
            notes.append("FSDP2 with PP: reshard_after_forward false (torchtitan's default policy)")
    if "llm-foundry" in f.get("source", "").lower() and choice.keys.get("fsdp", {}).get("version") == 1:
        _composer_fsdp_defaults(choice.keys["fsdp"], notes)
    if choice.cpu_checkpointing:
        if rec != "full":
            raise Unusable("activation checkpoints offloaded to CPU without full recomputation")
        training["cpu_checkpointing"] = True
    if choice.delayed_update:
        training["delayed_parameter_update"] = True
    compute = _compute(f, cluster, choice.megatron, notes)
    table: dict[str, Any] = {"model": model, "cluster": cluster, "nodes": layout.nodes, "parallel": parallel,
                             "training": training, "compute": compute, **choice.keys}
    if layout.gpus_per_node != cluster_gpn:
        table["gpus_per_node"] = layout.gpus_per_node
    micros = published_micro.candidates(glob, layout.dp) if micro_assumed else []
    return table, vocab, micros


FLASH_FRAMEWORKS = r"torchtitan|llm-foundry|fms-fsdp|megatron-core|flash"


def _compute(f: Mapping[str, str], cluster: str, megatron: bool, notes: list[str]) -> dict[str, str]:
    """[compute] of a row: Megatron-based frameworks run Megatron's fused kernels, the rest
    torch ops (torchtitan-style), under torch.compile where the row says compile; attention
    is FlashAttention where the framework used it (torchtitan, llm-foundry, fms-fsdp,
    Megatron-Core 2024, or the row says flash) and never on V100 (FlashAttention needs
    sm80+), unfused (QK^T, softmax, PV) otherwise; Float8 linears where the row says so
    (torchao's tensorwise recipe: torchtitan's float8 option); llm-foundry's loss as its
    default, flash-attn's fused cross-entropy (llmfoundry/models/mpt/modeling_mpt.py
    `ComposerMPTCausalLM`: loss_fn "fused_crossentropy")."""
    text = " ".join(f.get(c, "") for c in ("source", "framework", "other_config", "model")).lower()
    flash = bool(re.search(FLASH_FRAMEWORKS, text)) and "v100" not in f.get("gpu", "").lower() \
        and not cluster.lower().startswith(("dgx-2", "dgx1"))
    compiled = "compile" in " ".join(f.get(c, "") for c in ("other_config", "framework")).lower()
    if compiled and megatron:
        notes.append("torch.compile not modelled with Megatron's kernels")
    out = {"kernels": "megatron" if megatron else "torch-compile" if compiled else "torch",
           "attention": "flash" if flash else "unfused"}
    if float8_linears(f.get("precision", ""), f.get("other_config", "")):
        out["float8"] = "tensorwise"
        notes.append("Float8 linears as torchao's tensorwise recipe (torchtitan's float8 option)")
        if "all-gather" in f.get("precision", "").lower():
            notes.append("FSDP float8 all-gather not modelled: parameters gathered in bf16")
    if "llm-foundry" in text:
        out["cross_entropy"] = "fused"
        notes.append("loss: flash-attn's fused cross-entropy (llm-foundry's default loss_fn, fused_crossentropy)")
    notes.append(f"kernels {out['kernels']}, attention {out['attention']} (from the framework and date)")
    return out


def _composer_fsdp_defaults(fsdp: dict[str, Any], notes: list[str]) -> None:
    """llm-foundry's benchmark runs (scripts/train/benchmarking, sweep.sh at the commit that
    added its H100 tables: mosaicml/llm-foundry b2a43a1, torch 2.1.0 cu121 image) go through
    Composer's FSDP1 wrapper with what their tables and scripts state and Composer's defaults
    for what they leave out: "MP Mode DEFAULT" in every table row (submit_benchmarks.py
    `--fsdp_config_mixed_precision` default), which Composer maps to param_dtype bf16 and
    reduce_dtype fp32 (composer/distributed/mosaic_parallelism.py `get_mixed_precision`), and
    backward_prefetch, which neither the yamls nor the sweep set: Composer's default
    BACKWARD_POST (composer/utils/parallelism.py `FSDPConfig.backward_prefetch`)."""
    fsdp["reduce_dtype"] = "fp32"
    fsdp["backward_prefetch"] = "BACKWARD_POST"
    notes.append("Composer FSDP1 as llm-foundry's benchmarks ran it: mixed_precision DEFAULT (fp32 "
                 "reduce-scatters), backward_prefetch BACKWARD_POST (Composer's default)")


def _sequence_parallel(f: Mapping[str, str]) -> bool:
    text = " ".join(f.get(c, "") for c in ("act_ckpt", "other_config", "framework")).lower()
    return "sequence parallel" in text


def _schedule_notes(f: Mapping[str, str], pp: int, megatron: bool, notes: list[str]) -> int:
    """Model chunks per pipeline stage the row states (interleaved 1F1B with Megatron: "virtual
    stages per device) = 3"); what the row ran that the simulator does not model, recorded
    rather than refused."""
    text = " ".join(f.get(c, "") for c in ("other_config", "framework")).lower()
    stated = re.search(r"virtual stages[^=]*=\s*(\d+)", text)
    chunks = int(stated.group(1)) if stated and pp > 1 and megatron else 1
    if chunks > 1:
        notes.append(f"interleaved 1F1B with {chunks} model chunks per stage (as stated)")
    elif "interleav" in text and pp > 1 and not stated:
        notes.append("interleaved 1F1B without a stated number of chunks: simulated as plain 1F1B")
    return chunks


# -- the 17-column FSDP / offload table --------------------------------------------------------

_SIMPLE_SOURCES = {"LF": ("llm-foundry benchmarks (mosaicml/llm-foundry scripts/train/benchmarking)",
                          "https://github.com/mosaicml/llm-foundry"),
                   "FMS": ("fms-fsdp README", "https://github.com/foundation-model-stack/fms-fsdp"),
                   "ZFC": ("DeepSpeed blog zenflow-corebinding", "https://github.com/deepspeedai/DeepSpeed "
                           "blogs/zenflow-corebinding")}


def simple_fields(raw: Mapping[str, str | None], index: int) -> dict[str, str]:
    """A row of published-fsdp-offload.csv in the 39-column vocabulary ('ns' = not stated,
    '?' = assumed; micro_batch '8(GA4)' = micro 8 with 4 accumulation steps; global batch =
    global_batch_tokens / seq_len)."""
    r = {k: _simple_cell(v) for k, v in raw.items() if k}
    source, url = _SIMPLE_SOURCES.get(r.get("source", ""), (r.get("source", ""), ""))
    micro, _, accum = r.get("micro_batch", "").partition("(")
    seq = integer(r.get("seq_len", ""), "seq_len", [])
    tokens = integer(r.get("global_batch_tokens", ""), "global_batch", [])
    glob = str(tokens // seq) if seq and tokens and tokens % seq == 0 else ""
    fw, zero, offload = _simple_engine(r.get("fsdp_or_zero", ""))
    unit = {"tok/s/gpu": "tokens/s/GPU"}.get(r.get("unit", "").lower(), r.get("unit", ""))
    definition = "llm-foundry MFU (counts attention FLOPs)" if r.get("source") == "LF" else ""
    return {
        "id": f"{r.get('source', 'row')}{index:02d}", "source": source, "source_url": url,
        "value_kind": "table_exact", "confidence": "medium" if "?" in "".join(v or "" for v in raw.values()) else "high",
        "model": r.get("model", ""), "gpu": r.get("gpu", ""), "total_gpus": r.get("gpus", ""),
        "gpus_per_node": r.get("gpus_per_node", "").replace("_used", ""), "tp": r.get("tp", ""),
        "pp": r.get("pp", ""), "dp": r.get("dp", ""), "framework": fw, "zero_stage": zero, "offload": offload,
        "micro_batch": micro.strip(), "global_batch": glob, "seq_len": r.get("seq_len", ""),
        "precision": _simple_precision(r.get("precision", "")), "act_ckpt": r.get("act_ckpt", ""),
        "metric": r.get("metric", "").replace("_", " "), "value": r.get("value", ""), "unit": unit,
        "metric_definition": definition, "other_config": f"grad accum {accum.rstrip(')')}" if accum else "",
    }


def _simple_cell(value: str | None) -> str:
    v = (value or "").strip()
    if v.lower() == "ns":
        return ""
    return v[:-1] + " (assumed)" if v.endswith("?") else v


def _simple_engine(text: str) -> tuple[str, str, str]:
    """fsdp_or_zero -> (framework, zero_stage, offload)."""
    t = text.upper()
    offload = "optimizer to CPU" if "OFFLOAD" in t else "none"
    if t.startswith("DS_ZERO-"):
        return f"DeepSpeed {text.split('+')[0][3:]}", t[8:9], offload
    if "HSDP" in t or "HYBRID" in t:
        return "PyTorch FSDP", "3 (HYBRID_SHARD)", offload
    if "NO_SHARD" in t:
        return "PyTorch FSDP", "0 (NO_SHARD)", offload
    if "GRAD_OP" in t:
        return "PyTorch FSDP", "2 (SHARD_GRAD_OP)", offload
    if "FSDP" in t:
        return ("PyTorch FSDP2" if "FSDP2" in t else "PyTorch FSDP"), "3 (FULL_SHARD)", offload
    return text, "", offload


def _simple_precision(text: str) -> str:
    low = text.lower()
    if low.startswith("amp_"):
        return f"{low[4:]} mixed"
    if low.endswith("_pure"):
        return f"{low[:-5]} (pure)"
    return text
