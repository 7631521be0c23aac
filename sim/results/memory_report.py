"""`zerosim memory`: per-GPU memory by ZeRO stage and component, and the largest model.

Everything here is the analytic twin (sim/analytic); the table shows, for the scenario's
model and layout, what each ZeRO stage would need per GPU on the rank with the most
parameters (pipeline stage 0 or the last stage), and the largest model that would fit.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from sim.analytic import activations as act
from sim.analytic.lora import lora_states
from sim.analytic.memory import (
    ModelStateBytes,
    fragmentation_bytes,
    largest_trainable_params,
    model_state_bytes,
    zero_buffer_bytes,
)
from sim.analytic.params import largest_module_params, total_params
from sim.analytic.placement import block_params_per_rank, params_per_stage
from sim.analytic.recompute import kept_activation_bytes
from sim.core.enums import AttentionImpl, Convention, KernelStyle, LossImpl, ScheduleMode, ZeroStage
from sim.core.units import BYTES_PER_ELEMENT
from sim.engines.plan import model_of, resident_memory
from sim.engines.resident import Resident
from sim.engines.schedule import Mem
from sim.inputs.scenario import Scenario
from sim.inputs.zero_config import LEGACY_VERSION, ZeroConfig

STAGE_LABELS = {0: "DP (no ZeRO)", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}


@dataclass(frozen=True, slots=True)
class MemoryRow:
    """Bytes per GPU for one ZeRO stage."""

    stage: int
    label: str
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    buffers_bytes: float
    fragmentation_bytes: float
    host_bytes: float
    total_bytes: float
    fits: bool | None                  # None when no device memory is known
    largest_model_params: float | None  # Psi whose model states fit beside the rest; None: unbounded


@dataclass(frozen=True, slots=True)
class MemoryReport:
    title: str
    convention: str
    n_params: float
    params_per_rank: float
    dp: int
    tp: int
    pp: int
    device_memory_bytes: float | None
    fragmentation: float
    this_stage: int | None
    rows: tuple[MemoryRow, ...]
    notes: tuple[str, ...]
    k: float = 12.0                    # optimizer bytes per parameter (paper convention)
    resident: dict[str, float] | None = None   # the own row's resident bytes (sim.engines.resident)
    pipeline_stage: int = 0                    # the stage shown: the rank with the highest need
    host_memory_bytes: float | None = None     # DRAM per node
    gpus_per_node: int = 1
    nvme_bytes_per_gpu: float = 0.0            # ZeRO-Infinity: state swapped to the node's NVMe
    nvme_capacity_bytes: float = 0.0

    @property
    def fits_nvme(self) -> bool:
        return self.nvme_bytes_per_gpu * self.gpus_per_node <= self.nvme_capacity_bytes

    @property
    def fits(self) -> bool | None:
        if self.this_stage is None:
            return None
        own = self.rows[self.this_stage].fits
        return own if own is None else own and self.fits_nvme

    def to_json(self) -> dict[str, object]:
        out = asdict(self)
        out["fits"] = self.fits
        out["largest_model_params_limit"] = {
            STAGE_LABELS[s]: _limit(self, s) for s in range(4)} if self.device_memory_bytes else None
        return out


def _limit(report: MemoryReport, stage: int) -> float | None:
    """Largest Psi as dp -> infinity (model states only); None for 'unbounded'."""
    assert report.device_memory_bytes is not None
    value = largest_trainable_params(report.device_memory_bytes, math.inf, ZeroStage(stage),
                                     Convention(report.convention), k=report.k)
    return None if math.isinf(value) else value


def quick_report(n_params: float, dp: int, *, convention: Convention, device_memory: float | None,
                 k: float = 12.0, largest_module: float = 0.0) -> MemoryReport:
    """Model states only, from a parameter count and a DP degree (no scenario)."""
    rows = []
    for stage in ZeroStage:
        states = model_state_bytes(n_params, dp, stage, convention, k=k,
                                   largest_module_params=largest_module)
        rows.append(_row(stage, states, 0.0, 0.0, 0.0, device_memory, n_params))
    notes = ("model states only: activations, buffers and fragmentation not included",)
    return MemoryReport(title=f"{n_params / 1e9:g}B parameters, dp = {dp}", convention=str(convention),
                        n_params=n_params, params_per_rank=n_params, dp=dp, tp=1, pp=1,
                        device_memory_bytes=device_memory, fragmentation=0.0, this_stage=None,
                        rows=tuple(rows), notes=notes, k=k)


def scenario_report(s: Scenario, *, convention: Convention = Convention.ALLOCATED,
                    fragmentation: float = 0.0) -> MemoryReport:
    """The table for a scenario: its model, layout, activations and engine buffers. In the
    `allocated` convention the scenario's own row is what its engine holds (sim.engines.resident,
    the same allocations the simulator starts from) plus its largest transient buffers."""
    model_of(s)                     # refuses what the scenario's engine cannot do, as `zerosim run` does
    m, p = s.model, s.parallel
    per_stage = params_per_stage(m, p.tp, s.stages)
    own = ZeroStage(s.zero_stage)
    worst = max(range(p.pp), key=lambda i: model_state_bytes(per_stage[i], p.dp, own, convention).total
                + _activations(s, i))
    psi_rank = per_stage[worst]
    activ = _activations(s, worst)
    largest = largest_module_params(m) / p.tp
    offload_opt = bool(s.zero and s.zero.offload_optimizer.enabled)
    offload_par = bool(s.zero and s.zero.offload_param.enabled)
    resident = resident_memory(s, worst) if convention is Convention.ALLOCATED else None
    rows = []
    for stage in ZeroStage:
        if resident is not None and stage == own:
            states, buffers = own_row_states(s, resident, largest, psi_rank, worst)
        elif m.lora is not None:     # the frozen 16-bit base and the adapters' states at that stage
            states, buffers = lora_states(m, p.dp, stage), _deepspeed_buffers(s, stage)
        else:
            states = model_state_bytes(
                psi_rank, p.dp, stage, convention, largest_module_params=largest,
                offload_optimizer=offload_opt and stage >= ZeroStage.OPTIMIZER,
                offload_params=offload_par and stage == ZeroStage.PARAMETERS)
            buffers = _deepspeed_buffers(s, stage)
        frag = fragmentation_bytes(activ + buffers, fragmentation)
        rows.append(_row(stage, states, activ, buffers, frag, s.cluster.gpu.memory, psi_rank,
                         host_memory=s.cluster.host.dram, gpus_per_node=s.gpus_per_node))
    return MemoryReport(
        title=f"{s.name}: {m.name} on {s.nodes} x {s.cluster.name} ({s.world_size} GPUs), "
              f"tp {p.tp} pp {p.pp} dp {p.dp}, engine {s.engine}",
        convention=str(convention), n_params=float(total_params(m)), params_per_rank=psi_rank,
        dp=p.dp, tp=p.tp, pp=p.pp, device_memory_bytes=s.cluster.gpu.memory,
        fragmentation=fragmentation, this_stage=int(s.zero_stage), rows=tuple(rows),
        notes=_notes(s, worst, offload_opt, offload_par),
        resident=_by_category(resident) if resident is not None else None, pipeline_stage=worst,
        host_memory_bytes=s.cluster.host.dram, gpus_per_node=s.gpus_per_node,
        nvme_bytes_per_gpu=resident.nvme_bytes if resident is not None else 0.0,
        nvme_capacity_bytes=s.cluster.host.nvme_capacity)


def own_row_states(s: Scenario, resident: Resident, largest: float,
                   stage_params: float, stage: int = 0) -> tuple[ModelStateBytes, float]:
    """(model states, buffers) of the scenario's own row: the resident allocations plus the
    largest transient ones the engine makes (the simulator allocates these as ops run):
    DeepSpeed's fp32 gradient partition during a GPU optimizer step (a `sub_group_size`
    tile at stage 3), ZeRO-3's gathered 16-bit parameters and gradients of the largest
    module and its prefetched parameters, FSDP2's gathered blocks and one reduce-scatter input."""
    params, grads = resident.device_bytes(Mem.PARAMS), resident.device_bytes(Mem.GRADS)
    optimizer, buffers = resident.device_bytes(Mem.OPTIMIZER), resident.device_bytes(Mem.BUFFERS)
    h = 4 if s.training.precision.value == "fp32" else 2
    z = s.zero
    if z is not None and s.schedule_mode is ScheduleMode.IMPLEMENTED and not z.offload_optimizer.enabled:
        partition = optimizer / 12.0          # fp32 master + m + v: 12 B per partitioned parameter
        if z.stage == ZeroStage.PARAMETERS:
            params += 4.0 * largest
            if z.deepspeed_version != LEGACY_VERSION:       # v0.5's gathers are not prefetched ahead
                buffers += min(z.prefetch_bucket_size, z.max_live_parameters) * h
            partition = min(partition, z.sub_group_size)
        if not s.bf16_optimizer_bytes:    # BF16_Optimizer steps on a view of its accumulation buffer
            optimizer += 4.0 * partition
    if s.fsdp is not None:
        buffers += _fsdp2_buffers(s, stage_params, stage)
    return ModelStateBytes(params=params, grads=grads, optimizer=optimizer, host=resident.host_bytes), buffers


def _fsdp2_buffers(s: Scenario, stage_params: float, stage: int) -> float:
    """FSDP2's gathered units at the peak (every block of the stage when blocks are not
    resharded after forward, else the current one and its forward prefetch; the root's part
    unless `reshard_root`) and its unsharded gradients (one reduce-scatter input, or with
    pipeline stages every gradient of the stage, accumulated in the reduce dtype)."""
    f, m, p = s.fsdp, s.model, s.parallel
    assert f is not None
    param_bytes = BYTES_PER_ELEMENT[f.param_dtype or s.training.precision.value]
    reduce_bytes = BYTES_PER_ELEMENT[f.reduce_dtype or f.param_dtype or s.training.precision.value]
    block = block_params_per_rank(m, p.tp)
    blocks = s.stages.counts()[stage]
    root = 0.0 if f.reshard_root else stage_params - blocks * block
    kept = blocks if f.reshard_after_forward is False else min(f.forward_prefetch, m.layers - 1) + 1
    gradients = reduce_bytes * stage_params if p.pp > 1 else param_bytes * block
    return param_bytes * (kept * block + root) + gradients


def _by_category(r: Resident) -> dict[str, float]:
    out = {m.value: r.device_bytes(m) for m in (Mem.PARAMS, Mem.GRADS, Mem.OPTIMIZER, Mem.BUFFERS)}
    out["host"] = r.host_bytes
    return out


def _row(stage: ZeroStage, states: ModelStateBytes, activ: float, buffers: float, frag: float,
         device_memory: float | None, psi: float, *, host_memory: float | None = None,
         gpus_per_node: int = 1) -> MemoryRow:
    """One stage's row; it fits when the device total fits the GPU and the host column of
    every GPU of a node fits its DRAM. The largest model scales this row's model-state
    bytes per parameter."""
    total = states.total + activ + buffers + frag
    fits = None if device_memory is None else total <= device_memory
    if fits and host_memory is not None:
        fits = states.host * gpus_per_node <= host_memory
    largest = None
    if device_memory is not None:
        free = device_memory - activ - buffers - frag
        largest = max(0.0, free) / (states.total / psi) if states.total > 0 else None
    return MemoryRow(stage=int(stage), label=STAGE_LABELS[int(stage)], params_bytes=states.params,
                     grads_bytes=states.grads, optimizer_bytes=states.optimizer,
                     activations_bytes=activ, buffers_bytes=buffers, fragmentation_bytes=frag,
                     host_bytes=states.host, total_bytes=total, fits=fits,
                     largest_model_params=largest)


def _activations(s: Scenario, pp_stage: int) -> float:
    """Activations held by one rank of pipeline stage `pp_stage` at its peak (1F1B): an
    upper estimate, with every kept activation, the head's and the recompute working set
    (N blocks for uniform chunks of N) counted at once, where the planner frees the head
    before it recomputes (tests/unit/test_recompute_plan.py)."""
    m, p, t = s.model, s.parallel, s.training
    value_bytes = 4 if t.precision.value == "fp32" else 2
    # blocks per model chunk (the stage's, without interleaving: any split)
    layers = s.stages.counts()[pp_stage] if p.virtual_stages == 1 else m.layers // (p.pp * p.virtual_stages)
    inflight = act.inflight_microbatches(p.pp, t.grad_accum, pp_stage, p.virtual_stages)
    flash = s.compute.attention is AttentionImpl.FLASH
    per_layer = act.layer_activation_bytes(m, t.seq_len, t.micro_batch, recompute=t.recompute, tp=p.tp,
                                           sequence_parallel=p.sequence_parallel, value_bytes=value_bytes,
                                           flash=flash)
    plan = t.recompute_plan
    if plan is not None:
        if s.partitioned_checkpoints:
            per_layer /= p.tp  # ZeRO-R P_a: each TP rank keeps 1/t of every checkpoint
        if t.cpu_checkpointing:
            per_layer = 0.0    # checkpoints live in host memory
    full = act.layer_activation_bytes(m, t.seq_len, t.micro_batch, recompute=act.Recompute.NONE, tp=p.tp,
                                      sequence_parallel=p.sequence_parallel, value_bytes=value_bytes, flash=flash)
    total = kept_activation_bytes(layers, plan, full=per_layer if plan is None else full,
                                  checkpoint=per_layer) * inflight
    if plan is not None and t.contiguous_checkpoints:   # buffers no checkpoint fills (sim.engines.skeleton)
        total += max(0, t.contiguous_checkpoints - len(plan.segments(layers))) * per_layer
    if plan is not None:
        working = plan.working(layers)
    else:    # per-op selective: one block's recomputed activations during its backward
        working = 1 if t.recompute is act.Recompute.SELECTIVE_OP else 0
    total += working * act.recompute_working_bytes(m, t.seq_len, t.micro_batch, recompute=t.recompute, tp=p.tp,
                                                   sequence_parallel=p.sequence_parallel, value_bytes=value_bytes,
                                                   flash=flash)
    if pp_stage == p.pp - 1:
        fused = s.compute.cross_entropy is LossImpl.FUSED
        total += act.outside_layers_activation_bytes(m, t.seq_len, t.micro_batch, tp=p.tp,
                                                     value_bytes=value_bytes, fused_loss=fused)
        total += act.loss_backward_transient_bytes(m, t.seq_len, t.micro_batch, tp=p.tp, value_bytes=value_bytes,
                                                   megatron=s.compute.kernels is KernelStyle.MEGATRON, fused=fused)
    return total


def _deepspeed_buffers(s: Scenario, stage: ZeroStage) -> float:
    """Communication buffers DeepSpeed would hold at `stage` (the rows other than the
    scenario's own, which come from its engine)."""
    z = s.zero or ZeroConfig(stage=stage, overlap_comm=stage == ZeroStage.PARAMETERS)
    return zero_buffer_bytes(stage, reduce_bucket_size=z.reduce_bucket_size,
                             overlap_comm=z.overlap_comm if s.zero else stage == ZeroStage.PARAMETERS,
                             prefetch_bucket_size=z.prefetch_bucket_size,
                             max_live_parameters=z.max_live_parameters)


def _notes(s: Scenario, worst: int, offload_opt: bool, offload_par: bool) -> tuple[str, ...]:
    t = s.training
    notes = [f"activations: {s.model.name} blocks, seq {t.seq_len}, micro-batch {t.micro_batch}, "
             f"recompute {t.recompute}" + (", sequence parallel" if s.parallel.sequence_parallel else "")]
    if s.parallel.pp > 1:
        notes.append(f"pipeline stage {worst} shown (the rank with the highest need); 1F1B keeps "
                     f"{act.inflight_microbatches(s.parallel.pp, t.grad_accum, worst, s.parallel.virtual_stages)} "
                     f"{'model-chunk passes' if s.parallel.virtual_stages > 1 else 'micro-batches'} in flight")
    if offload_opt or offload_par:
        notes.append("offload: the host column is per GPU; stages below the scenario's are shown "
                     "with the same offload settings where DeepSpeed allows them")
    notes.append("largest model: model states that fit beside these activations and buffers")
    return tuple(notes)
