"""Cross-file rules of a scenario: what a real run would reject, reported with the numbers.

Sources: Megatron-LM asserts that TP divides attention heads and query groups and that
PP divides the layers (megatron/core/transformer/transformer_config.py); DeepSpeed's
PipelineEngine asserts ZeRO stage < 2 (deepspeed/runtime/pipe/engine.py); ZeRO++ hpZ
needs the partition size to divide the data-parallel world (stage3.py).
"""

from __future__ import annotations

from pathlib import Path

from sim.core.enums import (
    AttentionImpl,
    Engine,
    Float8Recipe,
    KernelStyle,
    Precision,
    Recompute,
    ScheduleMode,
    ZeroStage,
)
from sim.core.errors import InputError
from sim.core.model import Position
from sim.inputs.scenario import Scenario
from sim.inputs.schema import NOT_SIMULATED_YET
from sim.inputs.zero_config import BLOCKING_OFFLOAD_VERSION, CURRENT_VERSION


def check_scenario(s: Scenario, source: Path) -> None:
    """Raise InputError for the first rule `s` breaks."""
    _check_shapes(s, source)
    _check_precision(s, source)
    _check_delayed_update(s, source)
    _check_lora(s, source)
    _check_hpz(s, source)
    _check_nvme(s, source)
    _check_contiguous(s, source)
    _check_interleaving(s, source)
    _check_op_recompute(s, source)
    _check_grad_accum_dtype(s, source)
    _check_deepspeed_version(s, source)
    _check_float8(s, source)


FLOAT8_KERNELS = (KernelStyle.TORCH, KernelStyle.TORCH_COMPILE)


def _check_float8(s: Scenario, source: Path) -> None:
    """`[compute] float8` is torchao's Float8Linear (what torchtitan's float8 option swaps in):
    it needs fp8 tensor cores (Hopper or later) and a bf16 model (torchtitan trains in bf16);
    Transformer Engine's fp8 (what Megatron-Core runs) and Hugging Face's paths are not
    simulated."""
    if s.compute.float8 is Float8Recipe.NONE:
        return
    key, gpu = "compute.float8", s.cluster.gpu
    if gpu.fp8_flops <= 0:
        raise InputError(source, key, f"{s.compute.float8.value!r} on {gpu.name}, which has no fp8 tensor cores "
                         "(fp8_TFLOPS 0); allowed: \"none\", or a GPU with fp8 (H100, H200, B200)")
    if s.training.precision is not Precision.BF16:
        raise InputError(source, key, f"{s.compute.float8.value!r} with precision {s.training.precision.value}: "
                         f"{NOT_SIMULATED_YET}; allowed: precision bf16, or float8 \"none\"")
    megatron = s.engine is Engine.MEGATRON
    if s.compute.kernels not in FLOAT8_KERNELS or megatron or s.model.lora is not None \
            or s.schedule_mode is ScheduleMode.PAPER:
        raise InputError(source, key, f"{s.compute.float8.value!r} with kernels {s.compute.kernels.value}"
                         + (", engine megatron" if megatron else "")
                         + (", LoRA" if s.model.lora is not None else "")
                         + (', schedule "paper"' if s.schedule_mode is ScheduleMode.PAPER else "")
                         + f": {NOT_SIMULATED_YET} (Transformer Engine's fp8, Megatron's, is not modelled); allowed: kernels "
                         + " or ".join(f'"{k.value}"' for k in FLOAT8_KERNELS)
                         + " with a torch or DeepSpeed engine, without LoRA, or float8 \"none\"")


def _check_grad_accum_dtype(s: Scenario, source: Path) -> None:
    """DeepSpeed's data_types.grad_accum_dtype (engine.py `_do_optimizer_sanity_check`): the
    model's own dtype changes nothing; fp32 with bf16 and ZeRO-1 selects the BF16_Optimizer
    (Scenario.bf16_optimizer_bytes); without ZeRO a different dtype is DeepSpeed's error
    ("unsupported mix"); the other ZeRO cases are not simulated yet."""
    z = s.zero
    if z is None or z.grad_accum_dtype in (None, s.training.precision.value) or s.bf16_optimizer_bytes:
        return
    key, given = "zero.grad_accum_dtype", f"{z.grad_accum_dtype!r} with {s.training.precision.value}"
    if z.stage == 0:
        raise InputError(source, key, f"{given} and no ZeRO: DeepSpeed's 'unsupported mix of model_dtype and "
                         f"grad_accum_dtype'; allowed: {s.training.precision.value} or leave it out")
    raise InputError(source, key, f"{given} at ZeRO stage {int(z.stage)}"
                     + (" with offload_optimizer" if z.offload_optimizer.enabled else "")
                     + f": {NOT_SIMULATED_YET}; allowed: fp32 with bf16 and ZeRO-1 without offload "
                     "(DeepSpeed's BF16_Optimizer), or leave it out")


def _check_deepspeed_version(s: Scenario, source: Path) -> None:
    """`[zero] deepspeed_version` names a release's ZeRO-3: "0.6" differs from today's only in
    how the gradients go to the host under `offload_optimizer` (sim.engines.deepspeed_zero3);
    "0.5" is the 2021 fetch path (sim.engines.deepspeed_zero3_v05), modelled without what
    came later or was not part of it. ZeRO-1/2 of older releases are not simulated."""
    z = s.zero
    if z is None or z.deepspeed_version == CURRENT_VERSION:
        return
    if z.deepspeed_version == BLOCKING_OFFLOAD_VERSION:
        if z.stage != ZeroStage.PARAMETERS:
            raise InputError(source, "zero.deepspeed_version", f"{z.deepspeed_version!r} with ZeRO stage "
                             f"{int(z.stage)}: {NOT_SIMULATED_YET} (older releases are simulated for ZeRO-3 only); "
                             f"allowed: {CURRENT_VERSION!r}, or stage 3")
        return
    later = [what for what, used in (
        (f"ZeRO stage {int(z.stage)}", z.stage != ZeroStage.PARAMETERS),
        ("offload_optimizer / offload_param", z.offload_optimizer.enabled or z.offload_param.enabled),
        ("ZeRO++ (zero_quantized_weights, zero_quantized_gradients, zero_hpz_partition_size)",
         z.zero_quantized_weights or z.zero_quantized_gradients or z.zero_hpz_partition_size > 1),
        ("[lora]", s.model.lora is not None),
        ('schedule = "paper"', s.schedule_mode is ScheduleMode.PAPER)) if used]
    if later:
        raise InputError(source, "zero.deepspeed_version", f"{z.deepspeed_version!r} with {', '.join(later)}: "
                         f"{NOT_SIMULATED_YET}; allowed: {CURRENT_VERSION!r}, or {z.deepspeed_version!r} with "
                         "stage 3 and no offload, ZeRO++ or LoRA")


OP_RECOMPUTE_ENGINES = (Engine.DDP, Engine.DDP_ZERO_REDUNDANCY, Engine.FSDP2)


def _check_op_recompute(s: Scenario, source: Path) -> None:
    """torchtitan's per-op selective checkpointing (sim.analytic.op_sac) wraps blocks in
    torch.utils.checkpoint: a torch engine's option, modelled for dense, bias-free models
    without LoRA that run fused attention."""
    if s.training.recompute is not Recompute.SELECTIVE_OP:
        return
    key = "training.recompute"
    if s.engine not in OP_RECOMPUTE_ENGINES or s.schedule_mode is ScheduleMode.PAPER:
        raise InputError(source, key, f"\"selective-op\" (torchtitan's per-op policy) with engine {s.engine.value}: "
                         f"{NOT_SIMULATED_YET}; allowed: engines " + ", ".join(e.value for e in OP_RECOMPUTE_ENGINES)
                         + " with the implemented schedule, or recompute none, selective, full")
    m = s.model
    unsupported = [what for what, present in (("MoE experts", m.experts > 1), ("LoRA", m.lora is not None),
                                              (f"biases ({m.bias.value})", m.bias.value != "none"),
                                              ("unfused attention", s.compute.attention is not AttentionImpl.FLASH))
                   if present]
    if unsupported:
        raise InputError(source, key, f"\"selective-op\" with {', '.join(unsupported)}: {NOT_SIMULATED_YET}; "
                         "allowed: dense, bias-free models with compute.attention = \"flash\", "
                         "or recompute none, selective, full")


def _check_interleaving(s: Scenario, source: Path) -> None:
    """Megatron-Core's interleaved 1F1B (`--num-layers-per-virtual-pipeline-stage`): every
    model chunk holds the same number of layers, and the micro-batches of a step come in
    groups of pp (megatron/core/pipeline_parallel/schedules.py raises otherwise)."""
    p, v = s.parallel, s.parallel.virtual_stages
    if v == 1:
        return
    if s.engine is not Engine.MEGATRON:
        raise InputError(source, "parallel.virtual_stages", f"interleaved 1F1B with engine {s.engine.value}: "
                         f"{NOT_SIMULATED_YET}; allowed: engine megatron (DeepSpeed's pipeline has no interleaved "
                         f"schedule), or 1")
    if s.model.layers % (p.pp * v):
        raise InputError(source, "parallel.virtual_stages", f"pp ({p.pp}) x virtual_stages ({v}) does not divide the "
                         f"{s.model.layers} layers of {s.model.name}; allowed: a v with {s.model.layers} % (pp v) == 0")
    if s.training.grad_accum % p.pp:
        raise InputError(source, "parallel.virtual_stages", f"{s.training.grad_accum} micro-batches per step is not "
                         f"a multiple of pp ({p.pp}), which Megatron's interleaved schedule needs; allowed: "
                         f"a global batch of micro_batch x dp x a multiple of {p.pp}")


def _check_contiguous(s: Scenario, source: Path) -> None:
    """DeepSpeed's contiguous checkpoint buffers hold `number_checkpoints` checkpoints and are
    reset by the first backward: with pipeline parallelism several forwards fill them before
    one (1F1B warm-up), which is not simulated yet."""
    if s.training.contiguous_checkpoints and s.parallel.pp > 1:
        raise InputError(source, "training.contiguous_memory_optimization", f"with pp = {s.parallel.pp}: "
                         f"{NOT_SIMULATED_YET}; allowed: pp = 1, or false")


def _check_shapes(s: Scenario, source: Path) -> None:
    m, p = s.model, s.parallel
    if m.heads % p.tp:
        raise InputError(source, "parallel.tp", f"tp ({p.tp}) does not divide the attention heads "
                         f"({m.heads}) of {m.name}; allowed: a divisor of {m.heads}")
    if m.kv_heads % p.tp:
        raise InputError(source, "parallel.tp", f"tp ({p.tp}) does not divide the key/value heads "
                         f"({m.kv_heads}) of {m.name}; allowed: a divisor of {m.kv_heads}")
    if s.stages.uneven:
        if problem := s.stages.problem():
            raise InputError(source, "parallel.first_stage_layers", f"{problem} of {m.name} (pp {p.pp}); allowed: "
                             "end-stage layers that leave the other stages an even whole share")
        if p.virtual_stages > 1:
            raise InputError(source, "parallel.first_stage_layers", f"uneven end stages with virtual_stages = "
                             f"{p.virtual_stages}: {NOT_SIMULATED_YET}; allowed: virtual_stages = 1")
    elif m.layers % p.pp:
        raise InputError(source, "parallel.pp", f"pp ({p.pp}) does not divide the {m.layers} layers "
                         f"of {m.name}; allowed: a divisor of {m.layers}, or first_stage_layers / "
                         "last_stage_layers that leave the other stages an even share")
    if p.sequence_parallel and p.tp == 1:
        raise InputError(source, "parallel.sequence_parallel", "needs tp > 1")
    if m.position is Position.LEARNED and s.training.seq_len > m.max_positions:
        raise InputError(source, "training.seq_len", f"{s.training.seq_len} > the {m.max_positions} "
                         f"learned positions of {m.name}")


def _check_precision(s: Scenario, source: Path) -> None:
    gpu = s.cluster.gpu
    if s.training.precision == "bf16" and gpu.bf16_flops == 0:
        raise InputError(source, "training.precision", f"{gpu.name} has no bf16; allowed: fp16, fp32")


def _check_delayed_update(s: Scenario, source: Path) -> None:
    """The ZeRO-Offload paper's delayed parameter update overlaps CPU-Adam with the GPU: it
    needs DeepSpeed's optimizer offload."""
    if s.training.delayed_parameter_update and not (s.zero is not None and s.zero.offload_optimizer.enabled):
        raise InputError(source, "training.delayed_parameter_update", "true overlaps CPU-Adam with the next "
                         "step's forward and backward, so it needs engine \"deepspeed\" with "
                         "zero.offload_optimizer = \"cpu\"; allowed: false")


def _check_lora(s: Scenario, source: Path) -> None:
    """LoRA is simulated with DDP, ZeroRedundancyOptimizer, DeepSpeed ZeRO-0..3 and FSDP2, one
    data-parallel dimension (adapters split by tensor parallelism are not modelled yet)."""
    if s.model.lora is None:
        return
    p = s.parallel
    for axis in ("tp", "pp"):
        if getattr(p, axis) > 1:
            raise InputError(source, f"parallel.{axis}", f"{getattr(p, axis)} with [lora]: {NOT_SIMULATED_YET}; "
                             "allowed: 1")
    if s.engine is Engine.MEGATRON or s.schedule_mode is ScheduleMode.PAPER:
        what = "engine \"megatron\"" if s.engine is Engine.MEGATRON else "schedule \"paper\""
        raise InputError(source, "lora", f"LoRA with {what}: {NOT_SIMULATED_YET}; allowed: engines ddp, "
                         "ddp-zero-redundancy, deepspeed, fsdp2 with the implemented schedule")


def _check_hpz(s: Scenario, source: Path) -> None:
    """hpZ's secondary partition groups are `zero_hpz_partition_size` consecutive ranks, which
    must divide the data-parallel world (stage3.py asserts it); simulated where it is the
    number of data-parallel ranks on a node (DeepSpeed's recommended setting)."""
    z = s.zero
    if z is None or z.zero_hpz_partition_size <= 1:
        return
    hpz, dp = z.zero_hpz_partition_size, s.parallel.dp
    per_node = max(1, min(dp, s.gpus_per_node // (s.parallel.tp * s.parallel.pp) or 1))
    if dp % hpz:
        raise InputError(source, "zero.zero_hpz_partition_size", f"{hpz} does not divide the data-parallel "
                         f"world ({dp}); allowed: a divisor of {dp}")
    if hpz != per_node:
        raise InputError(source, "zero.zero_hpz_partition_size", f"{hpz} (secondary partitions of another size than "
                         f"a node's {per_node} data-parallel ranks): {NOT_SIMULATED_YET}; allowed: 1, {per_node}")


def _check_nvme(s: Scenario, source: Path) -> None:
    """ZeRO-Infinity swaps to the node's NVMe: its bandwidth and its capacity (to check that
    the swapped state fits) must be known."""
    z = s.zero
    if z is None:
        return
    for key, off in (("offload_optimizer", z.offload_optimizer), ("offload_param", z.offload_param)):
        if off.device.value != "nvme":
            continue
        host = s.cluster.host
        missing = [k for k, v in (("nvme_bandwidth_GBps", host.nvme_bandwidth), ("nvme_TB", host.nvme_capacity)) if not v]
        if missing:
            raise InputError(source, f"zero.{key}.device", f"'nvme' on {s.cluster.name}, whose [host] does not give "
                             f"{' or '.join(missing)}; allowed: none, cpu, or a cluster file with them")
