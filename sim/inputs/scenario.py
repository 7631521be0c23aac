"""The Scenario: everything one simulation needs, validated and frozen (design.md, data flow).

Built by sim.inputs.load from a scenario file (and the model, cluster and ds_config files it
names); read by every layer above.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sim.analytic.recompute import UNIFORM, RecomputePlan, plan_of
from sim.analytic.stages import Stages
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
    ZeroStage,
)
from sim.core.model import ModelSpec
from sim.core.specs import ClusterSpec
from sim.inputs.scenario_tables import DdpConfig, FsdpConfig, MegatronConfig
from sim.inputs.zero_config import ZeroConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class CommConfig:
    """[comm]: the collective algorithm and optional bus-bandwidth overrides per group axis
    (bytes/s; the SimAI-style busbw table, design.md fidelity rules)."""

    algorithm: Algorithm = Algorithm.AUTO
    busbw: tuple[tuple[Axis, float], ...] = ()

    def override(self, axis: Axis | None) -> float | None:
        return dict(self.busbw).get(axis) if axis is not None else None


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeConfig:
    """[compute]: whose kernels run the model (sim.analytic.kernels): the implementation's
    fusions and the attention kernel."""

    kernels: KernelStyle = KernelStyle.TORCH
    attention: AttentionImpl = AttentionImpl.FLASH
    float8: Float8Recipe = Float8Recipe.NONE
    cross_entropy: LossImpl = LossImpl.NATIVE


@dataclass(frozen=True, slots=True, kw_only=True)
class Parallelism:
    """Degrees of the three parallel axes; tp * pp * dp = world size."""

    tp: int
    pp: int
    dp: int
    sequence_parallel: bool = False
    virtual_stages: int = 1      # model chunks per pipeline stage (Megatron's interleaved 1F1B)
    first_stage_layers: int = 0  # blocks of the first / last pipeline stage; 0: the even share (sim.analytic.stages)
    last_stage_layers: int = 0

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp


@dataclass(frozen=True, slots=True, kw_only=True)
class Training:
    """Batch, precision and recomputation of one optimizer step."""

    seq_len: int
    micro_batch: int
    grad_accum: int
    global_batch: int            # sequences per optimizer step, whole job
    precision: Precision
    recompute: Recompute
    gradient_clipping: float     # 0 = off; on costs one small all-reduce per step
    partition_activations: bool  # ZeRO-R P_a (DeepSpeed activation_checkpointing)
    cpu_checkpointing: bool
    optimizer: OptimizerImpl = OptimizerImpl.FUSED   # how the Adam step runs
    recompute_method: str = UNIFORM  # which blocks full recomputation checkpoints (sim.analytic.recompute)
    recompute_layers: int = 1
    delayed_parameter_update: bool = False   # ZeRO-Offload paper's DPU (sim.engines.offload)
    contiguous_checkpoints: int = 0   # DeepSpeed's contiguous_memory_optimization: number_checkpoints (0: off)

    @property
    def recompute_plan(self) -> RecomputePlan | None:
        """The checkpointed blocks of full recomputation; None without it."""
        return plan_of(self.recompute, self.recompute_method, self.recompute_layers)


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """Everything one simulation needs, validated."""

    name: str
    path: Path | None
    question: str
    model: ModelSpec
    cluster: ClusterSpec
    nodes: int
    gpus_per_node: int
    parallel: Parallelism
    training: Training
    engine: Engine
    zero: ZeroConfig | None   # set for engine 'deepspeed'
    fsdp: FsdpConfig | None   # set for engine 'fsdp2'
    ddp: DdpConfig | None     # set for 'ddp' and 'ddp-zero-redundancy'
    megatron: MegatronConfig | None = None   # set for 'megatron'
    schedule_mode: ScheduleMode = ScheduleMode.IMPLEMENTED
    comm: CommConfig = CommConfig()
    compute: ComputeConfig = ComputeConfig()

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def stages(self) -> Stages:
        """Which blocks each pipeline stage holds (sim.analytic.stages)."""
        p = self.parallel
        return Stages(self.model.layers, p.pp, p.first_stage_layers, p.last_stage_layers)

    @property
    def bf16_optimizer_bytes(self) -> int:
        """DeepSpeed runs its BF16_Optimizer (deepspeed/runtime/bf16_optimizer.py) for bf16
        with ZeRO-1 and fp32 gradient accumulation, or bf16 without ZeRO under a pipeline
        (engine.py `_do_optimizer_sanity_check`): the bytes per element of its full-size
        gradient-accumulation buffer (the accumulation dtype), 0 when it does not."""
        z = self.zero
        if self.engine is not Engine.DEEPSPEED or z is None or self.training.precision.value != "bf16":
            return 0
        if z.stage == ZeroStage.OPTIMIZER and z.grad_accum_dtype == "fp32" and not z.offload_optimizer.enabled:
            return 4
        if z.stage == ZeroStage.NONE and self.parallel.pp > 1 and z.grad_accum_dtype in (None, "bf16"):
            return 2
        return 0

    @property
    def partitioned_checkpoints(self) -> bool:
        """DeepSpeed's `partition_activations` splits each checkpoint of full recomputation
        over the TP group (with sequence parallelism it is split already)."""
        p = self.parallel
        return self.training.partition_activations and p.tp > 1 and not p.sequence_parallel

    @property
    def zero_stage(self) -> ZeroStage:
        """The ZeRO stage the engine amounts to (FSDP2 with resharding = 3, without = 2;
        ZeroRedundancyOptimizer = 1; DDP = 0)."""
        if self.zero is not None:
            return self.zero.stage
        if self.fsdp is not None:
            return ZeroStage.PARAMETERS if self.fsdp.reshard_after_forward else ZeroStage.GRADIENTS
        if self.engine is Engine.DDP_ZERO_REDUNDANCY or (self.megatron and self.megatron.distributed_optimizer):
            return ZeroStage.OPTIMIZER
        return ZeroStage.NONE


