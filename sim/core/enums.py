"""The shared vocabulary: enums every layer uses (inputs, analytic twin, engines, DES,
results). Imports nothing else of sim."""

from __future__ import annotations

from enum import IntEnum, StrEnum


class ZeroStage(IntEnum):
    """What ZeRO shards across the data-parallel group; each stage includes the previous."""

    NONE = 0
    OPTIMIZER = 1
    GRADIENTS = 2
    PARAMETERS = 3


class Convention(StrEnum):
    """Memory accounting conventions (sim.analytic.memory)."""

    PAPER = "paper"
    LECTURE = "lecture"
    DEEPSPEED = "deepspeed"
    ALLOCATED = "allocated"


class Recompute(StrEnum):
    NONE = "none"
    SELECTIVE = "selective"  # attention core recomputed (Korthikanti Sec. 5); = FlashAttention
    SELECTIVE_OP = "selective-op"  # torchtitan's per-op policy: every second matmul and the cheap ops (op_sac)
    FULL = "full"            # only each block's input is kept


class Algorithm(StrEnum):
    AUTO = "auto"                  # NCCL's choice: the fastest of ring and tree (all-reduce) x protocols
    RING = "ring"
    TREE = "tree"                  # double binary tree for all-reduce (ring for the others)
    HIERARCHICAL = "hierarchical"  # 2-level all-reduce across nodes (ring for the others)


class Coll(StrEnum):
    """Collectives, named as torch.distributed names them."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALL_TO_ALL = "all_to_all"
    SEND_RECV = "send_recv"


class Axis(StrEnum):
    """The parallel axes a process group spans."""

    TP = "tp"
    PP = "pp"
    DP = "dp"
    DP_NODE = "dp_node"        # the data-parallel peers on the rank's own node (ZeRO++ hpZ, qgZ's first hop)
    DP_ACROSS = "dp_across"    # one data-parallel peer per node, at the rank's place in its node (qgZ's second hop)
    DP_SHARD = "dp_shard"      # HSDP's shard group: `shard` consecutive data-parallel ranks (FSDP2 2D mesh)
    DP_REPLICATE = "dp_replicate"   # HSDP's replicate group: the ranks at the same place of every shard group
    DP_POST = "dp_post"        # FSDP2's post-forward mesh (int reshard_after_forward): k consecutive ranks


class Engine(StrEnum):
    """Which training engine's schedule is replayed."""

    DEEPSPEED = "deepspeed"
    FSDP2 = "fsdp2"
    DDP = "ddp"
    DDP_ZERO_REDUNDANCY = "ddp-zero-redundancy"  # torch ZeroRedundancyOptimizer under DDP
    MEGATRON = "megatron"                        # Megatron-Core DDP, optionally its distributed optimizer


class ScheduleMode(StrEnum):
    """`implemented`: the engines as their code runs; `paper`: the ZeRO paper / lecture's
    idealised schedules (reduce-scatter + all-gather, per-segment broadcast and reduce)."""

    IMPLEMENTED = "implemented"
    PAPER = "paper"


class Precision(StrEnum):
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"


class OffloadDevice(StrEnum):
    NONE = "none"
    CPU = "cpu"
    NVME = "nvme"


class KernelStyle(StrEnum):
    """[compute] kernels: which implementation's kernel fusions (sim.analytic.kernels)."""

    MEGATRON = "megatron"
    TORCH = "torch"
    TORCH_COMPILE = "torch-compile"
    HF = "hf"


class LossImpl(StrEnum):
    """[compute] cross_entropy: the loss kernel (sim.analytic.kernels.cross_entropy)."""

    NATIVE = "native"    # the implementation's own (`kernels`): torch / HF fp32 log-softmax, Megatron's vocab-parallel
    FUSED = "fused"      # flash-attn's Triton cross-entropy (flash_attn/losses/cross_entropy.py): llm-foundry's default


class Float8Recipe(StrEnum):
    """[compute] float8: the blocks' Linears in fp8 (sim.analytic.kernels.float8_linear)."""

    NONE = "none"
    TENSORWISE = "tensorwise"    # torchao Float8Linear, dynamic tensorwise scaling (torchtitan's float8)


class OptimizerImpl(StrEnum):
    """How the Adam step runs (torch.optim's `fused` / `foreach` / single-tensor loop;
    DeepSpeed's and Megatron's FusedAdam are `fused`): sim.analytic.opcost.gpu_adam_time."""

    FUSED = "fused"
    FOREACH = "foreach"
    FOR_LOOP = "for-loop"


class AttentionImpl(StrEnum):
    """[compute] attention: one fused kernel per pass, or GEMMs around a softmax."""

    FLASH = "flash"
    UNFUSED = "unfused"
