"""Scenario files (v1, design.md): one model, one cluster, one strategy, one question.

`load_scenario(path)` reads the TOML, resolves the model and cluster, reads a referenced
ds_config.json, fills batch sizes with DeepSpeed's rule and checks every cross-file
relation (sim.inputs.scenario_checks). Anything wrong raises `InputError` naming the file,
the key and what is allowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from sim.core import limits as L
from sim.core.enums import (
    Algorithm,
    AttentionImpl,
    Axis,
    Engine,
    Float8Recipe,
    KernelStyle,
    LossImpl,
    OptimizerImpl,
    Precision,
    Recompute,
    ScheduleMode,
)
from sim.core.errors import InputError
from sim.core.model import ModelSpec
from sim.core.specs import ClusterSpec
from sim.core.units import GB
from sim.inputs.aio_config import read_aio
from sim.inputs.catalog import resolve
from sim.inputs.deepspeed_config import read_deepspeed_config, resolve_batch
from sim.inputs.hardware import cluster_from_table, load_cluster
from sim.inputs.lora_table import read_lora, with_lora
from sim.inputs.models import load_model
from sim.inputs.reading import parse_toml, read_text
from sim.inputs.scenario import CommConfig, ComputeConfig, Parallelism, Scenario, Training
from sim.inputs.scenario_checks import check_scenario
from sim.inputs.scenario_tables import ddp_from_table, fsdp_from_table, megatron_from_table, read_training
from sim.inputs.schema import Key, check_value, read_table
from sim.inputs.zero_config import ZeroConfig, zero_from_dict

TOP_KEYS = (
    Key("model", object), Key("cluster", object), Key("nodes", int, positive=True, maximum=L.MAX_NODES),
    Key("gpus_per_node", int, required=False, default=None, positive=True, maximum=L.MAX_GPUS_PER_NODE),
    Key("engine", str, required=False, default=None, choices=tuple(Engine)),
    Key("deepspeed", str, required=False, default=None),
    Key("parallel", dict, required=False, default={}),
    Key("training", dict),
    Key("zero", dict, required=False, default=None),
    Key("fsdp", dict, required=False, default=None),
    Key("ddp", dict, required=False, default=None),
    Key("megatron", dict, required=False, default=None),
    Key("schedule", str, required=False, default="implemented", choices=tuple(ScheduleMode)),
    Key("comm", dict, required=False, default={}),
    Key("compute", dict, required=False, default={}),
    Key("lora", dict, required=False, default=None),
    Key("aio", dict, required=False, default=None),
)
COMPUTE_KEYS = (
    Key("kernels", str, required=False, default="torch", choices=tuple(KernelStyle)),
    Key("attention", str, required=False, default="flash", choices=tuple(AttentionImpl)),
    Key("float8", str, required=False, default="none", choices=tuple(Float8Recipe)),
    Key("cross_entropy", str, required=False, default="native", choices=tuple(LossImpl)),
)
COMM_KEYS = (
    Key("algorithm", str, required=False, default="auto", choices=tuple(Algorithm)),
    Key("busbw_GBps", dict, required=False, default={}),
)
PARALLEL_KEYS = (
    Key("tp", int, required=False, default=1, positive=True, maximum=L.MAX_WORLD),
    Key("pp", int, required=False, default=1, positive=True, maximum=L.MAX_WORLD),
    Key("dp", int, required=False, default=None, positive=True, maximum=L.MAX_WORLD),
    Key("sequence_parallel", bool, required=False, default=False),
    Key("virtual_stages", int, required=False, default=1, positive=True, maximum=L.MAX_LAYERS),
    Key("first_stage_layers", int, required=False, default=0, positive=True, maximum=L.MAX_LAYERS),
    Key("last_stage_layers", int, required=False, default=0, positive=True, maximum=L.MAX_LAYERS),
)


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file."""
    path = Path(path)
    text = read_text(path)
    return scenario_from_table(parse_toml(text, path), path, path.stem, _question(text))


def scenario_from_table(raw: Mapping[str, Any], source: Path, name: str, question: str = "") -> Scenario:
    """Build a Scenario from a parsed table; relative paths are relative to `source`."""
    base = source.parent
    top = read_table(raw, TOP_KEYS, source)
    model, cluster, gpn = _hardware(top, source)
    if top["nodes"] * gpn > L.MAX_WORLD:
        raise InputError(source, "nodes", f"{top['nodes']} nodes x {gpn} GPUs = {top['nodes'] * gpn:,} GPUs; "
                         f"allowed: at most {L.MAX_WORLD:,} GPUs")
    parallel = _parallel(top["parallel"], top["nodes"] * gpn, source)
    engine = _engine(top, source)
    ds = None
    if top["deepspeed"] is not None:
        ds_path = resolve(top["deepspeed"], "scenarios", base, source, "deepspeed")
        ds = read_deepspeed_config(ds_path, hidden=model.hidden)
    training = _training(top["training"], ds, parallel.dp, engine, source, cluster.node.host.synchronous)
    zero = None
    if engine is Engine.DEEPSPEED:
        zero = ds.zero if ds else zero_from_dict(top["zero"] or {}, source, "zero.", hidden=model.hidden)
    if top["aio"] is not None:
        zero = _with_aio(zero, top["aio"], ds is not None, source)
    scenario = Scenario(
        name=name, path=source, question=question, model=model, cluster=cluster,
        nodes=top["nodes"], gpus_per_node=gpn, parallel=parallel, training=training,
        engine=engine, zero=zero,
        fsdp=fsdp_from_table(top["fsdp"] or {}, source) if engine is Engine.FSDP2 else None,
        ddp=ddp_from_table(top["ddp"] or {}, source) if engine in (Engine.DDP, Engine.DDP_ZERO_REDUNDANCY) else None,
        megatron=megatron_from_table(top["megatron"] or {}, source) if engine is Engine.MEGATRON else None,
        schedule_mode=ScheduleMode(top["schedule"]), comm=_comm(top["comm"], source),
        compute=_compute(top["compute"], source))
    check_scenario(scenario, source)
    return scenario


def hardware_of(raw: Mapping[str, Any], source: Path) -> tuple[ModelSpec, ClusterSpec, int, int]:
    """(model, cluster, nodes, GPUs per node) of a scenario table, without its layout and
    batch (what `zerosim search` varies), checked as the loader checks them."""
    top = read_table({k: v for k, v in raw.items() if k in {key.name for key in TOP_KEYS}}
                     | {"training": raw.get("training", {})}, TOP_KEYS, source)
    model, cluster, gpn = _hardware(top, source)
    return model, cluster, top["nodes"], gpn


def _hardware(top: Mapping[str, Any], source: Path) -> tuple[ModelSpec, ClusterSpec, int]:
    """The model (with its LoRA adapters), the cluster and the GPUs per node used."""
    base = source.parent
    model = _model(top["model"], base, source)
    if top["lora"] is not None:
        model = with_lora(model, read_lora(top["lora"], source), source)
    cluster = _cluster(top["cluster"], base, source)
    gpn = top["gpus_per_node"] or cluster.gpus_per_node
    if gpn > cluster.gpus_per_node:
        raise InputError(source, "gpus_per_node", f"{gpn} > the cluster's {cluster.gpus_per_node} "
                         f"({cluster.name}); allowed: 1..{cluster.gpus_per_node}")
    return model, cluster, gpn


def _with_aio(zero: ZeroConfig | None, raw: Mapping[str, Any], from_ds: bool, source: Path) -> ZeroConfig:
    """The scenario's [aio] table (DeepSpeed's top-level `aio`) on its ZeRO settings."""
    if zero is None:
        raise InputError(source, "aio", "DeepSpeed's libaio settings need the DeepSpeed engine ([zero] or a "
                         "deepspeed config)")
    if from_ds:
        raise InputError(source, "aio", "given in the scenario and in its deepspeed config; allowed: one of them")
    return replace(zero, aio=read_aio(raw, source))


def _comm(raw: Mapping[str, Any], source: Path) -> CommConfig:
    v = read_table(raw, COMM_KEYS, source, "comm.")
    busbw = []
    for axis, value in v["busbw"].items():
        if axis not in tuple(Axis):
            raise InputError(source, f"comm.busbw_GBps.{axis}", f"unknown group axis; allowed: "
                             f"{', '.join(Axis)}")
        rate = check_value(value, Key(axis, float, positive=True), source, f"comm.busbw_GBps.{axis}")
        busbw.append((Axis(axis), rate * GB))
    return CommConfig(algorithm=Algorithm(v["algorithm"]), busbw=tuple(sorted(busbw)))


def _compute(raw: Mapping[str, Any], source: Path) -> ComputeConfig:
    v = read_table(raw, COMPUTE_KEYS, source, "compute.")
    return ComputeConfig(kernels=KernelStyle(v["kernels"]), attention=AttentionImpl(v["attention"]),
                         float8=Float8Recipe(v["float8"]), cross_entropy=LossImpl(v["cross_entropy"]))


def _question(text: str) -> str:
    """The opening comment lines of a scenario file: the question it answers."""
    question = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        question.append(line.lstrip("#").strip())
    return " ".join(q for q in question if q)


def _model(ref: Any, base: Path, source: Path) -> ModelSpec:
    return load_model(ref, base, source, "model")


def _cluster(ref: Any, base: Path, source: Path) -> ClusterSpec:
    if isinstance(ref, Mapping):
        return cluster_from_table(ref, source, base, "cluster.")
    if not isinstance(ref, str):
        raise InputError(source, "cluster", "expected a cluster catalog name, a path or a [cluster] table")
    return load_cluster(resolve(ref, "hardware", base, source, "cluster"))


def _parallel(raw: Mapping[str, Any], world: int, source: Path) -> Parallelism:
    v = read_table(raw, PARALLEL_KEYS, source, "parallel.")
    tp, pp = v["tp"], v["pp"]
    dp = v["dp"]
    if dp is None:
        if world % (tp * pp):
            raise InputError(source, "parallel", f"world size {world} (nodes x gpus_per_node) is not "
                             f"divisible by tp ({tp}) * pp ({pp}) = {tp * pp}")
        dp = world // (tp * pp)
    if tp * pp * dp != world:
        raise InputError(source, "parallel", f"tp ({tp}) * pp ({pp}) * dp ({dp}) = {tp * pp * dp} "
                         f"!= nodes x gpus_per_node = {world}")
    if v["virtual_stages"] > 1 and pp < 2:
        raise InputError(source, "parallel.virtual_stages", f"{v['virtual_stages']} model chunks per stage need a "
                         f"pipeline; allowed: 1 with pp = {pp}")
    for key in ("first_stage_layers", "last_stage_layers"):
        if v[key] and pp < 2:
            raise InputError(source, f"parallel.{key}", f"{v[key]} layers on an end stage need a pipeline; "
                             f"allowed: leave it out with pp = {pp}")
    return Parallelism(tp=tp, pp=pp, dp=dp, sequence_parallel=v["sequence_parallel"],
                       virtual_stages=v["virtual_stages"], first_stage_layers=v["first_stage_layers"],
                       last_stage_layers=v["last_stage_layers"])


def _engine(top: Mapping[str, Any], source: Path) -> Engine:
    """Explicit `engine`, else deepspeed for [zero] / deepspeed =, fsdp2 for [fsdp], megatron
    for [megatron], else ddp."""
    has_ds = top["zero"] is not None or top["deepspeed"] is not None
    if top["zero"] is not None and top["deepspeed"] is not None:
        raise InputError(source, "zero", "give either [zero] or deepspeed = \"ds_config.json\", not both")
    if has_ds and top["fsdp"] is not None:
        raise InputError(source, "fsdp", "[fsdp] and DeepSpeed ZeRO settings exclude each other")
    tables = {Engine.DEEPSPEED: has_ds, Engine.FSDP2: top["fsdp"] is not None,
              Engine.MEGATRON: top["megatron"] is not None, Engine.DDP: top["ddp"] is not None}
    implied = next((e for e in (Engine.DEEPSPEED, Engine.FSDP2, Engine.MEGATRON) if tables[e]), Engine.DDP)
    engine = Engine(top["engine"]) if top["engine"] else implied
    own = Engine.DDP if engine is Engine.DDP_ZERO_REDUNDANCY else engine
    names = {Engine.DEEPSPEED: "[zero] / deepspeed", Engine.FSDP2: "[fsdp]", Engine.MEGATRON: "[megatron]",
             Engine.DDP: "[ddp]"}
    clashing = [names[e] for e, given in tables.items() if given and e is not own]
    if clashing:
        how = "given" if top["engine"] else f"implied by {names[own]}"
        raise InputError(source, "engine", f"engine '{engine}' ({how}) does not match the "
                         f"{' and '.join(clashing)} settings given; each engine takes only its own table: "
                         + ", ".join(f"{e} {t}" for e, t in names.items()))
    return engine


def _training(raw: Mapping[str, Any], ds: Any, dp: int, engine: Engine, source: Path, cpu_device: bool) -> Training:
    """[training] merged with a ds_config (conflicts are errors), batch filled DeepSpeed's way."""
    t = read_training(raw, source, have_deepspeed=ds is not None)
    names = {key: (source, f"training.{key}") for key in ("global_batch", "micro_batch", "grad_accum")}
    if ds is not None:
        for key, ds_key, value in (("global_batch", "train_batch_size", ds.train_batch_size),
                                   ("micro_batch", "train_micro_batch_size_per_gpu", ds.micro_batch),
                                   ("grad_accum", "gradient_accumulation_steps", ds.grad_accum),
                                   ("precision", "fp16/bf16", ds.precision)):
            if t[key] is not None and value is not None and t[key] != value:
                raise InputError(source, f"training.{key}", f"{t[key]!r} disagrees with the "
                                 f"DeepSpeed config's {ds_key} ({value!r})")
            if t[key] is None:
                t[key] = value
                if key in names and value is not None:
                    names[key] = (ds.path, ds_key)
    global_batch, micro, accum = resolve_batch(
        t["global_batch"], t["micro_batch"], t["grad_accum"], dp,
        (names["global_batch"], names["micro_batch"], names["grad_accum"]))
    clipping = t["gradient_clipping"]
    if clipping is None:  # DeepSpeed's code default is 1.0 (PR #8068), Megatron's --clip-grad 1.0;
        # torch clips only if asked
        clipping = ds.gradient_clipping if ds else (1.0 if engine in (Engine.DEEPSPEED, Engine.MEGATRON) else 0.0)
    return Training(seq_len=t["seq_len"], micro_batch=micro, grad_accum=accum,
                    global_batch=global_batch, precision=Precision(t["precision"]),
                    recompute=Recompute(t["recompute"]), gradient_clipping=clipping,
                    partition_activations=t["partition_activations"] or bool(ds and ds.partition_activations),
                    cpu_checkpointing=_cpu_checkpointing(t, ds, source),
                    optimizer=_optimizer(t["optimizer_implementation"], engine, ds, cpu_device),
                    recompute_method=t["recompute_method"], recompute_layers=t["recompute_num_layers"],
                    delayed_parameter_update=t["delayed_parameter_update"],
                    contiguous_checkpoints=_contiguous_checkpoints(t, ds, source))


def _cpu_checkpointing(t: Mapping[str, Any], ds: Any, source: Path) -> bool:
    """`training.cpu_checkpointing` or the DeepSpeed config's: the checkpoints of full
    recomputation kept in host memory, so only with recompute = "full"."""
    given = (source, "training.cpu_checkpointing") if t["cpu_checkpointing"] else \
        (ds.path, "activation_checkpointing.cpu_checkpointing") if ds is not None and ds.cpu_checkpointing else None
    if given is not None and t["recompute"] != Recompute.FULL:
        raise InputError(given[0], given[1], f"true moves the checkpoints of full recomputation to the host, but "
                         f"training.recompute is {t['recompute']!r}; allowed: recompute = \"full\", or false")
    return given is not None


def _contiguous_checkpoints(t: Mapping[str, Any], ds: Any, source: Path) -> int:
    """DeepSpeed's `contiguous_memory_optimization` with its `number_checkpoints` (from
    [training] or the DeepSpeed config's activation_checkpointing), 0 when off. DeepSpeed
    uses it only inside partition_activations (checkpointing.py `partition_activations`) and
    asserts a number of checkpoints; a key that would change nothing is refused here."""
    if ds is not None and ds.contiguous_memory_optimization:
        on, count = True, ds.number_checkpoints
        where = (ds.path, "activation_checkpointing.contiguous_memory_optimization")
    else:
        on, count = t["contiguous_memory_optimization"], t["number_checkpoints"]
        where = (source, "training.contiguous_memory_optimization")
    if not on:
        return 0
    partitioned = t["partition_activations"] or bool(ds and ds.partition_activations)
    if not partitioned or t["recompute"] != Recompute.FULL:
        raise InputError(where[0], where[1], "true copies partitioned activation checkpoints into contiguous "
                         "buffers (DeepSpeed uses it only then); allowed: with partition_activations = true and "
                         "recompute = \"full\", or false")
    if count is None:
        raise InputError(where[0], where[1].replace("contiguous_memory_optimization", "number_checkpoints"),
                         "missing: contiguous buffers are sized by the number of checkpoints (DeepSpeed asserts it); "
                         "allowed: an integer > 0, usually the checkpointed blocks per stage")
    return count


def _optimizer(given: str | None, engine: Engine, ds: Any, cpu_device: bool) -> OptimizerImpl:
    """`training.optimizer_implementation`, else the engine's: on a CPU device torch's Adam
    runs its single-tensor loop (foreach needs CUDA tensors; DeepSpeed's CPU runs use
    `torch_adam`); on a GPU DeepSpeed and Megatron run FusedAdam, and the torch engines
    torch.optim's default there, foreach (torch/optim/optimizer.py `_default_to_fused_or_foreach`:
    fused is never the default)."""
    if given is not None:
        return OptimizerImpl(given)
    if cpu_device:
        return OptimizerImpl.FOR_LOOP
    if ds is not None and ds.torch_adam:
        return OptimizerImpl.FOREACH
    if engine in (Engine.DDP, Engine.DDP_ZERO_REDUNDANCY, Engine.FSDP2):
        return OptimizerImpl.FOREACH
    return OptimizerImpl.FUSED
