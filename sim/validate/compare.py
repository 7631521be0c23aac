"""Planned vs recorded: the planner's collectives for one step against a real run's.

Both sides are reduced to the same vocabulary: (phase, collective, bytes S, group size)
in issue order; memory to the bytes of parameters, gradients and optimizer state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.core.enums import Axis, ZeroStage
from sim.engines.plan import layout_of, plan
from sim.engines.schedule import Collective, Mem, Phase, Send
from sim.inputs.load import scenario_from_table
from sim.inputs.scenario import Scenario

PHASES = {Phase.FWD: "forward", Phase.BWD: "backward", Phase.STEP: "optimizer"}


def validation_scenario(strategy: str, model: dict[str, Any], world: int, *, seq_len: int,
                        micro_batch: int, grad_accum: int, cluster: str = "local-cpu",
                        zero: dict[str, Any] | None = None, reshard_root: bool | None = None,
                        broadcast_buffers: bool = True, pp: int = 1) -> Scenario:
    """The scenario a validation run corresponds to (fp32, no clipping, local-cpu or a
    calibrated profile of this machine); `reshard_root` and `broadcast_buffers` as the
    run's FSDP2 root and DDP were configured, `pp` pipeline stages. Kernels are `hf`: the runs' models
    (sim.validate.torch_models.LlamaLike and transformers' LlamaForCausalLM) are eager
    PyTorch with RMSNorm as Python arithmetic and rotate_half rotary, as Hugging Face's."""
    engine = "fsdp2" if strategy.startswith("fsdp2") else "deepspeed" if strategy.startswith("deepspeed") else strategy
    table: dict[str, Any] = {
        "model": model, "cluster": cluster, "nodes": 1, "gpus_per_node": world, "engine": engine,
        "training": {"seq_len": seq_len, "micro_batch": micro_batch, "grad_accum": grad_accum,
                     "precision": "fp32", "gradient_clipping": 0.0},
        "compute": {"kernels": "hf"}}
    if engine == "fsdp2":
        table["fsdp"] = {"reshard_after_forward": {"fsdp2-no-reshard": False, "fsdp2-reshard-2": 2}.get(strategy, True)}
        if strategy == "fsdp2-hsdp":
            table["fsdp"]["replicate_degree"] = 2
        if strategy == "fsdp2-tp2":
            table["parallel"] = {"tp": 2, "sequence_parallel": True}
        if reshard_root is not None:
            table["fsdp"]["reshard_root"] = reshard_root
    if engine in ("ddp", "ddp-zero-redundancy"):
        table["ddp"] = {"broadcast_buffers": broadcast_buffers}
    if engine == "deepspeed":
        table["zero"] = {"stage": int(strategy[-1]), **(zero or {})}   # deepspeed-zeroN: code defaults
    if pp > 1:             # DeepSpeed's PipelineEngine (sim.validate.deepspeed_pipe_runs)
        table["parallel"] = {"pp": pp}
    return scenario_from_table(table, Path("sim/validate/compare.py"), f"validate-{strategy}-{world}")


def planned(s: Scenario, *, tensor_parallel: bool = True) -> list[tuple[str, str, int, int]]:
    """(phase, op, bytes, group size) of every collective of one step, in issue order
    (without the TP group's with `tensor_parallel` false)."""
    layout = layout_of(s)
    out = []
    for op in sorted(plan(s).ops(0), key=lambda o: o.id):
        if isinstance(op, Collective | Send) and (tensor_parallel or op.axis is not Axis.TP):
            size = len(layout.group(op.axis, 0))
            out.append((PHASES[op.phase], op.coll.value, int(op.nbytes), size))
    return out


def recorded(log: list[dict[str, Any]], step: int, *, functional: bool = True) -> list[tuple[str, str, int, int]]:
    """The recorded collectives of step `step` (without DTensor's functional ones, the
    tensor-parallel collectives, with `functional` false)."""
    return [(e["phase"].split("/")[1], e["op"], int(e["nbytes"]), int(e["group_size"]))
            for e in log if e["phase"].startswith(f"{step}/") and (functional or not e.get("functional"))]


def planned_state(s: Scenario) -> dict[str, float]:
    """Bytes of parameters, gradients and optimizer state the plan keeps resident."""
    out = {"params": 0.0, "grads": 0.0, "optimizer": 0.0}
    for alloc in plan(s).classes[0].resident:
        if alloc.category in (Mem.PARAMS, Mem.GRADS, Mem.OPTIMIZER):
            out[alloc.category.value] += alloc.nbytes
    return out


def stage_of(s: Scenario) -> ZeroStage:
    return ZeroStage(int(s.zero_stage))
