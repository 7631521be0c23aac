"""Hardware, engine, parallel layout and batch of a published row, as scenario keys
(docs/scenarios.md). Rules (shared/validation/README.md sections 1 and 4):

- GPU -> catalog cluster: V100 on DGX-2 / SXM3 / 16 per node -> dgx2, V100 with 8 per node
  -> dgx1-v100; A100 by its memory (40 / 80 GB; unstated -> 80, recorded); H100 -> dgx-h100,
  the 96 GB HBM2e part (Grand Teton, torchtitan's benchmarks) -> grand-teton-h100;
  H200 -> hgx-h200; B200 -> dgx-b200; anything else is refused.
- Engine: FSDP / TorchTitan -> [fsdp] (FSDP1 as `version = 1`, NO_SHARD -> ddp,
  HYBRID_SHARD -> replicate_degree = nodes); DeepSpeed / ZeRO / Megatron-DeepSpeed ->
  [zero] stage n with the offload the row names; Megatron-LM alone -> [megatron] with the
  flags the row names (distributed optimizer, --overlap-grad-reduce, --overlap-param-gather,
  --tp-comm-overlap, which implies sequence parallelism); PyTorch DDP -> ddp.
- Layout: nodes = GPUs / GPUs per node (the cluster's when the row does not say); fewer
  GPUs than a node -> one node with `gpus_per_node`. tp / pp missing -> 1 unless the
  framework names model or pipeline parallelism. grad_accum = global / (micro x dp).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from sim.analytic.stages import embedding_balanced_ends
from sim.core.specs import ClusterSpec
from sim.inputs.catalog import resolve
from sim.inputs.hardware import load_cluster
from sim.inputs.zero_config import BLOCKING_OFFLOAD_VERSION, LEGACY_VERSION
from sim.studies.published_cells import Unusable, integer, is_blank, number, quote, states_nothing


@lru_cache(maxsize=None)
def catalog_cluster(name: str) -> ClusterSpec:
    return load_cluster(resolve(name, "hardware", Path("."), "published", "cluster"))


def _a100(g: str, notes: list[str]) -> str:
    has80, has40 = bool(re.search(r"80\s*g", g)), bool(re.search(r"40\s*g", g))
    if has80 != has40:
        return "dgx-a100-80g" if has80 else "dgx-a100-40g"
    likely = re.search(r"likely\s*(40|80)\s*g", g)
    size = likely.group(1) if likely else "80"
    notes.append(f"A100 memory {'ambiguous' if has80 else 'not stated'}: {size} GB assumed")
    return f"dgx-a100-{size}g"


def cluster_name(gpu: str, gpus_per_node: int | None, notes: list[str]) -> str:
    """The catalog cluster for the row's GPU text."""
    g = gpu.lower()
    if "v100" in g:
        if "dgx-1" in g or "dgx1" in g or (gpus_per_node == 8 and "dgx-2" not in g):
            return "dgx1-v100"
        if "dgx-2h" in g:
            notes.append("DGX-2H (V100 at about 130 TFLOP/s) simulated as DGX-2 (125)")
        elif not ("dgx-2" in g or "sxm3" in g or gpus_per_node == 16):
            notes.append(f"V100 node type not stated ({quote(gpu)}): DGX-2 assumed")
        return "dgx2"
    if "a100" in g:
        return _a100(g, notes)
    if "h100" in g:
        if any(w in g for w in ("96gb", "96 gb", "hbm2e", "grand teton")):
            return "grand-teton-h100"      # the 96 GB HBM2e, 500 W part torchtitan benchmarked on
        return "dgx-h100"
    if "h200" in g:
        return "hgx-h200"
    if "b200" in g:
        return "dgx-b200"
    raise Unusable(f"GPU {quote(gpu)} has no catalog cluster")


# -- engine ------------------------------------------------------------------------------------

@dataclass
class EngineChoice:
    keys: dict[str, Any]      # engine / zero / fsdp scenario keys
    family: str               # "fsdp" | "deepspeed" | "megatron" | "ddp"
    megatron: bool            # a Megatron-based framework (vocab padding, micro-batch 1 default)
    partition_activations: bool = False
    cpu_checkpointing: bool = False     # DeepSpeed's activation checkpoints in host memory
    delayed_update: bool = False        # the ZeRO-Offload paper's DPU


_MP_WORDS = r"megatron|\bmp\b|\btp\b|tensor|\b[234]d\b|ptd|model parallel"
_PP_WORDS = r"\bpp\b|pipeline|\b[34]d\b|ptd"


def engine_family(fw: str, zs: str) -> str:
    if "fsdp" in fw or "torchtitan" in fw or re.search(r"full_shard|shard_grad_op|hybrid_shard|no_shard|fsdp", zs):
        return "fsdp"
    if "deepspeed" in fw or re.search(r"\bzero\b|zero-|zero\+\+", fw) or "3d parallelism" in fw or "neox" in fw:
        return "deepspeed"
    if "megatron" in fw:
        return "megatron"
    if "ddp" in fw or fw.strip() == "pytorch":
        return "ddp"
    raise Unusable(f"framework {quote(fw)} is not mapped to a simulated engine")


def zero_stage(zs: str, fw: str, notes: list[str]) -> int:
    """'3', '2 (Pos+g)', 'Pos+g+p', '1 (presumed)'; else ZeRO-n / ZeRO-Offload / ZeRO-Infinity in the framework."""
    compact = zs.lower().replace(" ", "")
    if m := re.match(r"\s*([0-3])\b", zs):
        stage = int(m.group(1))
    elif "pos+g+p" in compact:
        stage = 3
    elif "pos+g" in compact:
        stage = 2
    elif "pos" in compact:
        stage = 1
    elif m := re.search(r"zero-?([0-3])\b", fw):
        stage = int(m.group(1))
    elif "zero-infinity" in fw:
        stage = 3
    elif "zero-offload" in fw:
        notes.append("ZeRO-Offload without a stage: ZeRO-2 assumed (ZeRO-Offload builds on ZeRO-2)")
        return 2
    else:
        raise Unusable("ZeRO stage not given" + (f" ({quote(zs)})" if zs.strip() else ""))
    if zs.strip() and not re.fullmatch(r"[0-3]", zs.strip()):
        notes.append(f"ZeRO stage {stage} read from {quote(zs)}")
    return stage


def ds_offload(text: str, stage: int, notes: list[str]) -> dict[str, Any]:
    """DeepSpeed offload keys from the offload cell, clause by clause (';'): the device each
    clause names (nvme / cpu; none = GPU) for the optimizer (gradients go with it) and, at
    stage 3, the parameters; activations to the CPU as `cpu_checkpointing` (the caller moves
    it to [training])."""
    low = " ".join(text.lower().split())
    if is_blank(low) or low in ("none", "no"):
        return {}
    if any(w in low for w in ("not stated", "exact split", "exact placement")):
        raise Unusable(f"offload placement not stated ({quote(text)})")
    out: dict[str, Any] = {}
    for clause in (c.strip() for c in low.split(";")):
        if "no offload" in clause:
            notes.append(f"offload cell also says {quote(clause)}: its first clause is used")
            continue
        if re.search(r"\bdpu\s*(on|enabled)", clause):
            out["delayed_parameter_update"] = True     # the caller moves it to [training]
            notes.append("the ZeRO-Offload paper's delayed parameter update (DPU) on")
        device: Any = "nvme" if "nvme" in clause else "cpu" if "cpu" in clause else None
        if device is None:
            continue
        if device == "nvme":    # the mount point changes nothing simulated; the rows do not give it
            device = {"device": "nvme", "nvme_path": "/local_nvme"}
        named = False
        if "optim" in clause or "grad" in clause or "adam" in clause:
            out.setdefault("offload_optimizer", device)
            named = True
        if "param" in clause and (stage == 3 or "zero-3" not in clause):
            out.setdefault("offload_param", device)
            named = True
        if "activation" in clause:
            out["cpu_checkpointing"] = True
            notes.append("activation checkpoints in CPU memory per the source (cpu_checkpointing)")
            named = True
        if not named:
            raise Unusable(f"offload placement not stated ({quote(text)})")
    return out


_ZERO_KNOBS = ("reduce_bucket_size", "allgather_bucket_size", "zero_hpz_partition_size", "overlap_comm",
               "contiguous_gradients", "reduce_scatter", "zero_quantized_weights", "zero_quantized_gradients",
               "max_live_parameters", "max_reuse_distance")


def zero_knobs(other: str, framework: str, gpn: int) -> dict[str, Any]:
    """DeepSpeed keys named in other_config ('reduce_bucket_size 1e7'; a flag named without a
    value, 'overlap_comm', 'zero_quantized_weights', is on);
    ZeRO++ in the framework turns on qwZ, qgZ and hpZ within a node (sim.engines.zeropp)."""
    out: dict[str, Any] = {}
    for key in _ZERO_KNOBS:
        if m := re.search(rf"{key}\s*[= ]?\s*(\d[\d.e+]*)?", other):
            value = m.group(1)
            out[key] = (int(float(value)) if value else True) if not key.startswith("zero_q") else True
    if "zero++" in framework.lower() and not out:
        out = {"zero_quantized_weights": True, "zero_quantized_gradients": True, "zero_hpz_partition_size": gpn}
    return out


def offload_pinning(other: str, zero: Mapping[str, Any]) -> dict[str, Any]:
    """`offload_optimizer.pin_memory true` (or false) named in other_config, for a row that
    offloads its optimizer: DeepSpeed then pins the host gradient buffer and the optimizer's
    host tensors (sim.engines.deepspeed_zero3 `_through_the_host_buffer`)."""
    m = re.search(r"offload_optimizer\.pin_memory\s*[= ]?\s*(true|false)", other, re.IGNORECASE)
    device = zero.get("offload_optimizer")
    if not m or not isinstance(device, str) or device == "none":
        return {}
    return {"offload_optimizer": {"device": device, "pin_memory": m.group(1).lower() == "true"}}


def engine(f: Mapping[str, str], nodes: int, gpn: int, notes: list[str], tp: int = 1) -> EngineChoice:
    fw, zs_text = f.get("framework", "").lower(), f.get("zero_stage", "")
    zs = zs_text.lower()
    family = engine_family(fw, zs)
    megatron = "megatron" in fw or "neox" in fw or "megatron" in f.get("model", "").lower()
    if family == "fsdp":
        return _fsdp(fw, zs, f.get("offload", "").lower(), nodes, notes)
    if family == "deepspeed":
        stage = zero_stage(zs_text, fw, notes)
        zero: dict[str, Any] = {"stage": stage, **ds_offload(f.get("offload", ""), stage, notes)}
        cpu_checkpointing = bool(zero.pop("cpu_checkpointing", False))
        delayed = bool(zero.pop("delayed_parameter_update", False))
        zero.update(zero_knobs(f.get("other_config", ""), f.get("framework", ""), gpn))
        zero.update(release_of(f, zero, notes))
        zero.update(offload_pinning(f.get("other_config", ""), zero))
        if "bf16optimizer" in zs.replace(" ", "").replace("_", "") and stage == 1:
            zero["grad_accum_dtype"] = "fp32"     # what selects BF16_Optimizer at ZeRO-1 in DeepSpeed
            notes.append("BF16Optimizer: DeepSpeed's BF16_Optimizer (ZeRO-1, fp32 gradient accumulation)")
        pa = "partition" in f.get("act_ckpt", "").lower() or bool(re.search(r"\bpa\b", zs))
        return EngineChoice({"engine": "deepspeed", "zero": zero}, family, megatron, pa, cpu_checkpointing, delayed)
    if family == "megatron":
        return EngineChoice({"engine": "megatron", "megatron": megatron_flags(f, tp, notes)}, family, True)
    if fw.strip() == "pytorch":
        notes.append("framework 'PyTorch' simulated as DDP")
    return EngineChoice({"engine": "ddp"}, family, megatron)


_MEGATRON_FLAGS = (("distributed_optimizer", r"distributed optimizer|--use-distributed-optimizer"),
                   ("overlap_grad_reduce", r"--overlap-grad-reduce"),
                   ("overlap_param_gather", r"--overlap-param-gather"),
                   ("tp_comm_overlap", r"--tp-comm-overlap"))


def megatron_flags(f: Mapping[str, str], tp: int, notes: list[str]) -> dict[str, bool]:
    """[megatron] keys from the flags the row names (zero_stage and other_config cells);
    none named is Megatron's default: replicated optimizer, gradients all-reduced after
    backward. --tp-comm-overlap is dropped at tp = 1, where Megatron turns sequence
    parallelism off and there is no TP communication to overlap."""
    text = " ".join(f.get(c, "") for c in ("zero_stage", "other_config")).lower()
    out = {key: True for key, pattern in _MEGATRON_FLAGS if re.search(pattern, text)}
    if tp == 1 and out.pop("tp_comm_overlap", False):
        notes.append("--tp-comm-overlap at tp = 1: nothing to overlap, dropped")
    notes.append("Megatron-Core engine model: " + (", ".join(out) if out else "no overlap flags named"))
    return out


def _fsdp(fw: str, zs: str, offload: str, nodes: int, notes: list[str]) -> EngineChoice:
    if "no_shard" in zs:
        notes.append("FSDP NO_SHARD simulated as DDP")
        return EngineChoice({"engine": "ddp"}, "ddp", False)
    fsdp: dict[str, Any] = {}
    if "shard_grad_op" in zs:
        fsdp["reshard_after_forward"] = False
    if ("hybrid" in zs or "replicate" in zs or "hsdp" in zs or "hsdp" in fw) and nodes > 1:
        fsdp["replicate_degree"] = nodes
    if "cpu" in offload:
        fsdp["cpu_offload"] = True
    if "fsdp2" not in fw and "torchtitan" not in fw:
        fsdp["version"] = 1
        notes.append("FSDP1: FullyShardedDataParallel per transformer block ([fsdp] version = 1: FlatParameter "
                     "gathered in place, no copy-out)")
    return EngineChoice({"engine": "fsdp2", "fsdp": fsdp}, "fsdp", False)


# -- parallel layout and batch -----------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int
    nodes: int
    gpus_per_node: int   # GPUs used per node


def _degree(f: Mapping[str, str], axis: str, words: str, total: int | None, notes: list[str]) -> int:
    text = f.get(axis, "")
    value = integer(text, axis, notes)
    if value is not None and value > 0:
        return value
    if not is_blank(text):
        raise Unusable(f"{axis} not given ({quote(text)})")
    if total != 1 and re.search(words, f.get("framework", "").lower()):
        raise Unusable(f"{axis} not given")
    if total != 1:
        notes.append(f"{axis} not given: 1 assumed (the framework names no {axis.upper()})")
    return 1


def context_parallel(f: Mapping[str, str]) -> None:
    text = f"{f.get('other_config', '')} {f.get('framework', '')}"
    if (m := re.search(r"\bCP\s*=\s*(\d+)", text)) and int(m.group(1)) > 1:
        raise Unusable(f"context parallelism (CP={m.group(1)}) is not simulated")


def layout(f: Mapping[str, str], cluster_gpn: int, row_gpn: int | None, notes: list[str]) -> Layout:
    """tp, pp, dp and the node count from the GPU-count columns."""
    context_parallel(f)
    total = integer(f.get("total_gpus", ""), "total_gpus", notes)
    nodes_col = integer(f.get("nodes", ""), "nodes", notes)
    tp = _degree(f, "tp", _MP_WORDS, total, notes)
    pp = _degree(f, "pp", _PP_WORDS, total, notes)
    dp_col = integer(f.get("dp", ""), "dp", notes)
    gpn = row_gpn or cluster_gpn
    if total is None:
        total = nodes_col * gpn if nodes_col else tp * pp * dp_col if dp_col else None
        if total is None:
            raise Unusable("total_gpus not given")
        notes.append(f"total_gpus not given: {total} from the nodes or tp x pp x dp columns")
    if total % (tp * pp):
        raise Unusable(f"{total} GPUs are not divisible by tp {tp} x pp {pp}")
    dp = total // (tp * pp)
    if dp_col is not None and dp_col != dp:
        raise Unusable(f"dp {dp_col} != {total} GPUs / (tp {tp} x pp {pp})")
    if total <= gpn:
        return Layout(tp, pp, dp, 1, total)
    if total % gpn:
        raise Unusable(f"{total} GPUs are not a whole number of {gpn}-GPU nodes")
    if nodes_col is not None and nodes_col != total // gpn:
        notes.append(f"nodes column says {nodes_col}; {total} GPUs / {gpn} per node = {total // gpn} used")
    return Layout(tp, pp, dp, total // gpn, gpn)


_TOKENS = re.compile(r"^~?\s*([\d.]+)\s*([KkM])?\s*tokens", re.I)
_SEQS = re.compile(r"(\d+)\s*(?:seqs|sequences)\b", re.I)


def _tokens(text: str, seq: int) -> int | None:
    """'2K tokens per GPU' / '4M tokens' -> sequences (K = 1024, M = 2^20), None when not whole."""
    m = _TOKENS.match(text.strip())
    if m is None:
        return None
    tokens = float(m.group(1)) * {"k": 1024, "m": 1024**2}.get((m.group(2) or "").lower(), 1)
    return int(tokens // seq) if tokens % seq == 0 else None


def batch(f: Mapping[str, str], seq: int, dp: int, megatron: bool, notes: list[str]) -> tuple[int, int, bool]:
    """(micro_batch, global_batch, micro-batch assumed); global must be a multiple of micro x
    dp. A Megatron row whose micro-batch cell gives nothing gets 1 here, marked assumed (its
    other candidates: sim.studies.published_micro)."""
    micro_text, global_text = f.get("micro_batch", ""), f.get("global_batch", "")
    micro = _tokens(micro_text, seq)
    if micro is not None:
        notes.append(f"micro_batch {micro} = {quote(micro_text)} / seq_len {seq}")
    else:
        micro = integer(micro_text, "micro_batch", notes)
    assumed = micro is None and megatron and states_nothing(micro_text)
    if assumed:
        micro = 1
    if micro is None or micro <= 0:
        raise Unusable("micro_batch not given" + (f" ({quote(micro_text)})" if micro_text.strip() else ""))
    glob = _global(global_text, seq, notes)
    if glob is None:
        if not is_blank(global_text):
            raise Unusable(f"global_batch not given ({quote(global_text)})")
        glob = micro * dp
        notes.append(f"global_batch not given: micro_batch x dp = {glob} (no accumulation) assumed")
    if glob % (micro * dp):
        raise Unusable(f"global_batch {glob} is not a multiple of micro_batch {micro} x dp {dp}")
    return micro, glob, assumed


def _global(text: str, seq: int, notes: list[str]) -> int | None:
    if m := _SEQS.search(text):
        value = int(m.group(1))
    elif (value_t := _tokens(text, seq)) is not None:
        value = value_t
    elif _TOKENS.match(text.strip()):
        return None
    else:
        return integer(text, "global_batch", notes)
    notes.append(f"global_batch {value} read from {quote(text)}")
    return value


def row_gpus_per_node(text: str, notes: list[str]) -> int | None:
    value = number(text, "gpus_per_node", notes)
    return int(value) if value and value == int(value) else None


def stage_split(f: Mapping[str, str], layers: int, pp: int, notes: list[str]) -> dict[str, int]:
    """[parallel] first / last stage layers for a row whose pipeline does not split its blocks
    evenly. DeepSpeed's PipelineModule with partition_method 'type:transformer|embedding' (the
    row names it; BLOOM's Megatron-DeepSpeed runs) balances the blocks and the two embedding
    layers together (deepspeed/runtime/pipe/module.py `_partition_layers`): with pp dividing
    layers + 2, every stage holds (layers + 2) / pp of them, so the end stages hold one block
    fewer (sim.analytic.stages.embedding_balanced_ends). Any other uneven split is refused, as the scenario check would (`layers` 0: a
    catalog model, split evenly)."""
    if pp < 2 or not layers or "transformer|embedding" not in f.get("other_config", "").lower():
        return {}
    if pp == 2 and layers % 2 == 0:      # each stage one embedding layer and half the blocks: even
        return {}
    ends = embedding_balanced_ends(layers, pp)
    if not ends:
        raise Unusable(f"PP partition 'type:transformer|embedding' of {layers} layers over {pp} stages is uneven "
                       f"inside the stages ({layers} + 2 units on {pp} stages): not simulated")
    notes.append(f"PP partition 'type:transformer|embedding': {ends} blocks on the first and last stages "
                 f"(beside the embeddings), {(layers - 2 * ends) // (pp - 2)} on the others")
    return {"first_stage_layers": ends, "last_stage_layers": ends}


def release_of(f: Mapping[str, str], zero: Mapping[str, Any], notes: list[str]) -> dict[str, str]:
    """`deepspeed_version` for a ZeRO-3 row, from its publication year (sim.inputs.zero_config):
    up to 2021 the 2021 fetch path ("0.5") unless it offloads or uses ZeRO++ (not simulated
    on that path: such rows keep today's); 2022 to 2025 the releases v0.6.0-v0.19.4 ("0.6":
    blocking gradient copies to the host, `pin_memory` off unless the row says); later, or
    with no year, today's."""
    year = publication_year(f)
    if zero.get("stage") != 3 or year is None or year >= 2026:
        return {}
    if year >= 2022:
        notes.append(f"ZeRO-3 of a {year} publication: DeepSpeed v0.6.0-v0.19.4 (blocking gradient copies to "
                     "the host with offload)")
        return {"deepspeed_version": BLOCKING_OFFLOAD_VERSION}
    if zero.get("offload_optimizer") or zero.get("offload_param") or any(
            k.startswith("zero_q") or k == "zero_hpz_partition_size" for k in zero):
        return {}
    notes.append(f"ZeRO-3 of a {year} publication: DeepSpeed's fetch path of that year (v0.3.13-v0.5.4: "
                 "per-parameter, synchronous gathers)")
    return {"deepspeed_version": LEGACY_VERSION}


def publication_year(f: Mapping[str, str]) -> int | None:
    """The year of the row's source: a venue tag such as SC21 or a four-digit year in the
    source or its location; None when neither says. DeepSpeed changed ZeRO-3's fetch path
    in v0.5.5 (Nov 2021, PR #1188) and v0.6.0 (Jan 2022, PR #1453), so the year tells which
    one a published ZeRO-3 run used (the latest year named: a later run citing an older
    paper is the later run). Offloading or ZeRO++ rows keep the current engine: the 2021
    path is simulated without them."""
    text = " ".join(f.get(c, "") for c in ("source", "source_location"))
    if venue := re.search(r"\b(?:SC|NeurIPS|ICML|ICLR|MLSys|OSDI|ATC|EuroSys|PPoPP|ASPLOS)'?(\d{2})\b", text):
        return 2000 + int(venue.group(1))
    years = [int(y) for y in re.findall(r"\b(20[12]\d)\b", text)]
    return max(years) if years else None
