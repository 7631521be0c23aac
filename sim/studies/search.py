"""`zerosim search`: the fastest layouts for a scenario's model, cluster and global batch.

1. Enumerate (`candidates`): tensor parallel degree t (a divisor of the attention and
   key/value heads, up to two nodes' GPUs), pipeline degree p (up to 64: a divisor of the
   layers, or of the layers + 2 with the end stages a block short, `pipeline_splits`) and with Megatron its model chunks per stage v (1, 2, 3, 4: interleaved 1F1B),
   data parallel d = GPUs / (t p), micro-batch b (1, 2, 4, 8, 16: d b must divide
   the global batch), recomputation (none, selective, full; with FSDP2 on a dense model
   also torchtitan's per-op "selective-op") and a training engine: Megatron-
   Core (distributed optimizer, overlapped gradient reduction and parameter gather,
   sequence parallelism with t > 1), DeepSpeed ZeRO-1 (any t, p; Megatron-DeepSpeed), ZeRO-2
   and ZeRO-3 (p = 1, as DeepSpeed requires; ZeRO-3 also with CPU optimizer offload), FSDP2
   (any t; with p > 1 torchtitan's pipeline, blocks kept gathered) and HSDP (shard groups of
   a node, one replica per node; p = 1). Each candidate is the scenario's table with those keys set, read by the
   scenario loader: what a file could not hold is rejected with the loader's reason.
2. Prune with the analytic twin: the memory report (sim.results.memory_report, an upper
   estimate of the peak) rejects what does not fit; a lower bound on the step
   (`lower_bound`: each stage's kernels at the kernel model's times, plus its
   tensor-parallel collectives on the compute stream, through the 1F1B fill and drain)
   orders the rest.
3. Simulate in order of the bound (branch and bound): once `top` layouts are simulated, a
   candidate whose bound is at least the `top`-th best step time cannot enter the ranking
   and is pruned with both numbers; at most `max_simulations` DES runs.

Every candidate ends up ranked or rejected with its reason."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from sim.analytic import opcost
from sim.analytic.stages import embedding_balanced_ends
from sim.analytic.volumes import tensor_parallel_volume
from sim.core.enums import Axis, Recompute
from sim.core.errors import InputError, one_line
from sim.core.model import ModelSpec
from sim.core.units import BYTES_PER_ELEMENT
from sim.des.engine import kernel_time
from sim.engines.plan import expected_dp_volume, model_of
from sim.engines.workload import EMBEDDINGS, shape_of, units
from sim.inputs.load import hardware_of, scenario_from_table
from sim.inputs.reading import parse_toml, read_text
from sim.inputs.scenario import Scenario
from sim.inputs.schema import check_value
from sim.inputs.zero_config import ZERO_KEYS
from sim.results.memory_report import scenario_report
from sim.simulate import simulate
from sim.studies.sweep import FIELDS, MEMORY_FIELDS, TIME_FIELDS, describe

MICRO_BATCHES = (1, 2, 4, 8, 16)
VIRTUAL_STAGES = (2, 3, 4)     # Megatron's interleaved 1F1B (model chunks per stage)
RECOMPUTE = ("none", "selective", "selective-op", "full")
OP_RECOMPUTE_ENGINES = ("fsdp2", "fsdp2 hsdp")      # torchtitan's per-op policy: torch engines, dense models
MAX_PP = 64
ENGINE_KEYS = ("engine", "zero", "fsdp", "ddp", "megatron", "deepspeed", "aio")
STRATEGIES: dict[str, dict[str, Any]] = {   # label: the scenario keys that choose the engine
    "megatron": {"engine": "megatron", "megatron": {"distributed_optimizer": True, "overlap_grad_reduce": True,
                                                    "overlap_param_gather": True}},
    "deepspeed z1": {"zero": {"stage": 1}},
    "deepspeed z2": {"zero": {"stage": 2, "overlap_comm": True}},
    "deepspeed z3": {"zero": {"stage": 3}},
    "deepspeed z3+offload": {"zero": {"stage": 3, "offload_optimizer": "cpu"}},
    "fsdp2": {"fsdp": {}},
    "fsdp2 hsdp": {"fsdp": {"replicate_degree": "nodes"}},   # shard inside a node, replicate across nodes
}
VERSION_KEY = next(k for k in ZERO_KEYS if k.name == "deepspeed_version")
PIPELINE_ENGINES = ("megatron", "deepspeed z1", "fsdp2")   # DeepSpeed refuses ZeRO-2/3 with pipelines
TENSOR_ENGINES = ("megatron", "deepspeed z1", "deepspeed z2", "deepspeed z3", "deepspeed z3+offload", "fsdp2",
                  "fsdp2 hsdp")


@dataclass
class Outcome:
    """One candidate: its keys, and either a result row or the reason it has none."""

    keys: dict[str, Any]
    scenario: Scenario | None = None
    bound_s: float = math.nan
    row: dict[str, Any] = field(default_factory=dict)
    reason: str = ""


def divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def pipeline_splits(layers: int, limit: int) -> list[tuple[int, int]]:
    """(p, blocks on each end stage; 0: the even split): every divisor of the layers, and
    the p >= 3 that divide layers + 2 but not the layers, with the embedding and head
    counted as a block each on the end stages (DeepSpeed's 'type:transformer|embedding'
    partition; Llama 3's 126 layers on 16 stages, 7 on each end, 8 on the others)."""
    even = [(p, 0) for p in divisors(layers, limit)]
    balanced = [(p, ends) for p in range(3, min(layers, limit) + 1) if (ends := embedding_balanced_ends(layers, p))]
    return sorted(even + balanced)


def candidates(m: ModelSpec, world: int, gpn: int, batch: int,
               strategies: Iterable[str] = tuple(STRATEGIES),
               recompute_options: Iterable[str] = RECOMPUTE) -> list[dict[str, Any]]:
    """The keys of every layout of `world` GPUs (`gpn` per node) to consider for model `m`
    at a global batch of `batch` sequences (module docstring)."""
    out = []
    for tp in divisors(math.gcd(m.heads, m.kv_heads), 2 * gpn):
        for pp, ends in pipeline_splits(m.layers, MAX_PP):
            if world % (tp * pp):
                continue
            dp = world // (tp * pp)
            for strategy in strategies:
                if (pp > 1 and strategy not in PIPELINE_ENGINES) or (tp > 1 and strategy not in TENSOR_ENGINES):
                    continue
                if strategy == "fsdp2 hsdp" and world <= gpn:
                    continue          # one node: HSDP is FSDP
                chunks = [1] + ([v for v in VIRTUAL_STAGES if m.layers % (pp * v) == 0]
                                if strategy == "megatron" and pp > 1 and not ends else [])
                for micro in MICRO_BATCHES:
                    if batch % (micro * dp):
                        continue
                    for v in chunks:
                        if v > 1 and (batch // (micro * dp)) % pp:
                            continue          # Megatron's interleaving needs micro-batches in groups of pp
                        for recompute in recompute_options:
                            if recompute == "selective-op" and (strategy not in OP_RECOMPUTE_ENGINES
                                                                or m.experts > 1 or m.lora is not None):
                                continue
                            out.append({"strategy": strategy, "tp": tp, "pp": pp, "virtual_stages": v,
                                        "end_stage_layers": ends, "dp": dp, "micro_batch": micro,
                                        "recompute": recompute})
    return out


def table_of(raw: Mapping[str, Any], keys: Mapping[str, Any], deepspeed_version: str | None = None) -> dict[str, Any]:
    """The base scenario table with the candidate's layout and engine; ZeRO-3 as DeepSpeed
    release `deepspeed_version` runs it (`[zero] deepspeed_version`)."""
    table = {k: v for k, v in raw.items() if k not in ENGINE_KEYS}
    parallel = {k: v for k, v in dict(raw.get("parallel") or {}).items()
                if k not in ("tp", "pp", "dp", "virtual_stages", "first_stage_layers", "last_stage_layers")}
    parallel.update(tp=keys["tp"], pp=keys["pp"])
    if keys.get("end_stage_layers"):
        parallel.update(first_stage_layers=keys["end_stage_layers"], last_stage_layers=keys["end_stage_layers"])
    if keys.get("virtual_stages", 1) > 1:
        parallel["virtual_stages"] = keys["virtual_stages"]
    if keys["strategy"] in ("megatron", "fsdp2", "fsdp2 hsdp") and keys["tp"] > 1:
        parallel["sequence_parallel"] = True      # Megatron-Core's and torchtitan's TP plans
    elif "sequence_parallel" in parallel and keys["tp"] == 1:
        del parallel["sequence_parallel"]
    training = {k: v for k, v in dict(raw.get("training") or {}).items() if k not in ("grad_accum", "micro_batch")}
    training.update(micro_batch=keys["micro_batch"], recompute=keys["recompute"])
    if keys["recompute"] != "full":
        for key in ("recompute_method", "recompute_num_layers", "cpu_checkpointing", "contiguous_memory_optimization",
                    "number_checkpoints"):
            training.pop(key, None)
    engine = STRATEGIES[keys["strategy"]]
    if keys["strategy"] == "fsdp2 hsdp":
        engine = {"fsdp": {"replicate_degree": raw.get("nodes", 1)}}
    if keys["strategy"] == "fsdp2" and keys["pp"] > 1:
        engine = {"fsdp": {"reshard_after_forward": False}}   # torchtitan's default with pipelines
    if keys["strategy"].startswith("deepspeed z3") and deepspeed_version:   # 0.5 refuses offload: rejected
        engine = {"zero": {**engine["zero"], "deepspeed_version": deepspeed_version}}
    return {**table, "parallel": parallel, "training": training, **engine}


def lower_bound(s: Scenario) -> float:
    """A step time the DES cannot beat. Stage k's work per micro-batch, t_k, is its kernels
    (forward, backward and what recomputation runs again, each at sim.analytic.kernel_time:
    the DES runs these and more) plus its tensor-parallel collectives at their group's bus
    bandwidth (on the compute stream, not overlapped). With 1F1B, stage k starts only after
    the stages before it have run the first micro-batch forward and ends only before they
    run the last one backward, so a step takes at least sum_{j<k} t_j + m t_k for every k
    (m micro-batches; (m + p - 1) t for p equal stages); interleaved over v chunks, at least
    (m + (p - 1) / v) t of the slowest end stage. Or, if longer, the data-parallel
    collectives' bytes at their bus bandwidth (`data_parallel_time`)."""
    t, p = s.training, s.parallel
    if p.virtual_stages > 1:
        per_micro = max(_stage_time(s, k) for k in {0, p.pp - 1})
        return max(per_micro * (t.grad_accum + (p.pp - 1) / p.virtual_stages), data_parallel_time(s))
    distinct = {k: _stage_time(s, k) for k in {0, min(1, p.pp - 1), p.pp - 1}}   # the middle stages are alike
    times = [distinct.get(k, distinct[min(1, p.pp - 1)]) for k in range(p.pp)]
    pipeline = max(sum(times[:k]) + t.grad_accum * times[k] for k in range(p.pp))
    return max(pipeline, data_parallel_time(s))


def _stage_time(s: Scenario, stage: int) -> float:
    """Stage `stage`'s kernels and tensor-parallel collectives for one micro-batch."""
    m, t, p, c = s.model, s.training, s.parallel, s.cluster
    plan = t.recompute_plan
    blocks = s.stages.counts()[stage]
    tp_bytes = sum(tensor_parallel_volume(blocks, False, p.tp, seq_len=t.seq_len, micro_batch=t.micro_batch,
                                          hidden=m.hidden, elem=BYTES_PER_ELEMENT[t.precision.value],
                                          grad_accum=1, sequence_parallel=p.sequence_parallel,
                                          recomputed=plan.recomputed(blocks) if plan else 0).values())
    seconds = stage_kernel_time(s, stage)
    if tp_bytes:
        shape = opcost.GroupShape(p.tp, -(-p.tp // s.gpus_per_node), min(p.tp, s.gpus_per_node))
        seconds += tp_bytes / opcost.links_rate(opcost.ring_links(shape, c), c)
    return seconds


def stage_kernel_time(s: Scenario, stage: int) -> float:
    """Seconds of kernels pipeline stage `stage` runs per micro-batch: its blocks' forward,
    input and weight gradients, the forwards full recomputation repeats (or the attention
    cores selective recomputation repeats), and the embedding (first stage) or final norm,
    head and loss (last stage)."""
    m, t, p = s.model, s.training, s.parallel
    shape = shape_of(s, p.tp)
    plan = t.recompute_plan
    if p.virtual_stages == 1:                             # any split (sim.analytic.stages)
        mine = list(s.stages.blocks(stage))
        recomputed = {mine[0] + i for seg in (plan.segments(len(mine)) if plan else ()) for i in seg}
    else:
        per = m.layers // (p.pp * p.virtual_stages)      # blocks per model chunk
        mine = [b for b in range(m.layers) if (b // per) % p.pp == stage]
        recomputed = {b for b in mine for seg in (plan.segments(per) if plan else ()) if b % per in seg}
    total = 0.0
    for u in units(m, shape):
        if u.block is not None and u.block not in mine:
            continue
        if u.block is None and stage != (0 if u.role in EMBEDDINGS else p.pp - 1):
            continue
        kernels = u.passes.forward + u.passes.backward_input + u.passes.backward_weight
        if u.block in recomputed:
            kernels += u.passes.forward
        elif t.recompute is Recompute.SELECTIVE:
            kernels += u.selective
        elif t.recompute is Recompute.SELECTIVE_OP:
            kernels += u.op_recompute
        total += sum(kernel_time(k, s) for k in kernels)
    return total


def data_parallel_time(s: Scenario) -> float:
    """The data-parallel collectives' bytes per rank (the analytic twin's volumes,
    sim.engines.plan.expected_dp_volume) at the bus bandwidth of the group's ring: however
    they overlap with compute or with each other, the rank's links cannot move them faster."""
    p = s.parallel
    if p.dp <= 1:
        return 0.0
    per_node = max(1, s.gpus_per_node // p.tp) if p.tp < s.gpus_per_node else 1
    shape = opcost.GroupShape(p.dp, -(-p.dp // per_node), min(per_node, p.dp))
    bandwidth = s.comm.override(Axis.DP) or opcost.links_rate(opcost.ring_links(shape, s.cluster), s.cluster)
    return sum(expected_dp_volume(s).values()) / bandwidth


def screen(raw: Mapping[str, Any], source: Path, keys: dict[str, Any], deepspeed_version: str | None = None) -> Outcome:
    """A candidate read as a scenario, checked by its engine, its memory estimated: an
    Outcome with its lower bound, or with the reason it is rejected."""
    out = Outcome(keys)
    try:
        s = scenario_from_table(table_of(raw, keys, deepspeed_version), source, source.stem)
        model_of(s)
        report = scenario_report(s)
    except InputError as error:
        out.reason = f"invalid: {one_line(error.problem)}"
        return out
    own = report.rows[report.this_stage] if report.this_stage is not None else None
    if own is not None and not own.fits:
        limit = report.device_memory_bytes or 0.0
        out.reason = f"does not fit (memory estimate): {own.total_bytes / 1e9:.1f} GB > {limit / 1e9:.1f} GB"
        return out
    out.scenario, out.bound_s = s, lower_bound(s)
    return out


def evaluate(out: Outcome) -> Outcome:
    """Simulate a screened candidate; a layout that runs out of memory is rejected."""
    assert out.scenario is not None
    result = simulate(out.scenario)
    report = result.to_json()
    row = {**describe(out.scenario), **{f: report[f] for f in FIELDS}}
    row.update({f: report["time"][f] for f in TIME_FIELDS})
    row.update({f: report["memory"][f] for f in MEMORY_FIELDS})
    out.row = row
    if not result.fits:
        out.reason = "does not fit (simulated): peak {:.1f} GB".format(report["memory"]["peak_bytes"] / 1e9)
    return out


def search(scenario: str | Path, *, top: int = 10, max_simulations: int = 64,
           strategies: Iterable[str] = tuple(STRATEGIES), recompute: Iterable[str] = RECOMPUTE,
           progress: Callable[[str], None] | None = None,
           deepspeed_version: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(ranked layouts, rejected layouts with their reasons) for the scenario file's model,
    cluster, nodes, sequence length, global batch and precision (module docstring).
    `deepspeed_version`: the DeepSpeed release whose ZeRO-3 the "deepspeed z3" layouts run
    (default: the scenario's `[zero] deepspeed_version`, else the current one): "0.6" is
    v0.6.0-v0.19.4, "0.5" the 2021 engine SC21 measured (sim.inputs.zero_config)."""
    path = Path(scenario)
    raw = parse_toml(read_text(path), path)
    if deepspeed_version is None and isinstance(raw.get("zero"), Mapping):
        deepspeed_version = raw["zero"].get("deepspeed_version")
    if deepspeed_version is not None:      # the [zero] key's own check, once, not per candidate
        check_value(deepspeed_version, VERSION_KEY, path, "zero.deepspeed_version")
    model, _, nodes, gpn = hardware_of(raw, path)
    batch = (raw.get("training") or {}).get("global_batch")
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise InputError(path, "training.global_batch", "a search keeps the global batch and varies the rest; "
                         "allowed: an integer > 0")
    if top < 1 or max_simulations < 1:
        raise InputError(path, "top", "allowed: --top and --max-simulations at least 1")
    outcomes = [screen(raw, path, keys, deepspeed_version) for keys in candidates(model, nodes * gpn, gpn, batch, strategies, recompute)]
    open_ = sorted((o for o in outcomes if not o.reason), key=lambda o: (o.bound_s, _order(o.keys)))
    if progress:
        progress(f"{len(outcomes)} layouts, {len(open_)} fit the memory estimate; simulating by lower bound")
    ranked: list[Outcome] = []
    runs = 0
    for o in open_:
        kth = sorted(r.row["step_time_s"] for r in ranked)[top - 1] if len(ranked) >= top else math.inf
        if o.bound_s >= kth:
            o.reason = f"pruned: lower bound {o.bound_s:.4g} s >= the {top}th best simulated step {kth:.4g} s"
            continue
        if runs >= max_simulations:
            o.reason = f"not simulated: {max_simulations} simulations done (lower bound {o.bound_s:.4g} s)"
            continue
        runs += 1
        evaluate(o)
        if not o.reason:
            ranked.append(o)
        if progress:
            progress(f"{runs} simulated: {_describe(o.keys)} {o.row.get('step_time_s', math.nan):.4g} s")
    return _ranked_frame(ranked, top), _rejected_frame(outcomes, ranked, top)


def _order(keys: Mapping[str, Any]) -> tuple[Any, ...]:
    return (list(STRATEGIES).index(keys["strategy"]), keys["tp"], keys["pp"], keys.get("virtual_stages", 1),
            keys["micro_batch"], RECOMPUTE.index(keys["recompute"]))


def _describe(keys: Mapping[str, Any]) -> str:
    chunks = f" x {keys['virtual_stages']} chunks" if keys.get("virtual_stages", 1) > 1 else ""
    chunks += f" ({keys['end_stage_layers']} blocks on each end)" if keys.get("end_stage_layers") else ""
    return (f"{keys['strategy']} tp {keys['tp']} pp {keys['pp']}{chunks} dp {keys['dp']} micro "
            f"{keys['micro_batch']} recompute {keys['recompute']}")


def _ranked_frame(ranked: list[Outcome], top: int) -> pd.DataFrame:
    best = sorted(ranked, key=lambda o: (o.row["step_time_s"], _order(o.keys)))
    rows = [{"rank": i + 1, **o.keys, "bound_s": o.bound_s, **o.row} for i, o in enumerate(best)]
    return pd.DataFrame(rows)


def _rejected_frame(outcomes: list[Outcome], ranked: list[Outcome], top: int) -> pd.DataFrame:
    shown = {id(o) for o in sorted(ranked, key=lambda o: o.row["step_time_s"])}
    rows = [{**o.keys, "bound_s": o.bound_s, "reason": o.reason, **({"step_time_s": o.row["step_time_s"]}
                                                                  if o.row else {})}
            for o in outcomes if id(o) not in shown]
    return pd.DataFrame(rows)
