"""Cross-file rules of a scenario: what a real run would reject, reported with the numbers.

Sources: Megatron-LM asserts that TP divides attention heads and query groups and that
PP divides the layers (megatron/core/transformer/transformer_config.py); DeepSpeed's
PipelineEngine asserts ZeRO stage < 2 (deepspeed/runtime/pipe/engine.py); ZeRO++ hpZ
needs the partition size to divide the data-parallel world (stage3.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sim.analytic.memory import ZeroStage
from sim.errors import InputError
from sim.model import Position
from sim.zero_config import OffloadDevice

if TYPE_CHECKING:
    from sim.scenario import Scenario


def check_scenario(s: Scenario, source: Path) -> None:
    """Raise InputError for the first rule `s` breaks."""
    _check_shapes(s, source)
    _check_precision(s, source)
    _check_engine_rules(s, source)


def _check_shapes(s: Scenario, source: Path) -> None:
    m, p = s.model, s.parallel
    if m.heads % p.tp:
        raise InputError(source, "parallel.tp", f"tp ({p.tp}) does not divide the attention heads "
                         f"({m.heads}) of {m.name}; allowed: a divisor of {m.heads}")
    if m.kv_heads % p.tp:
        raise InputError(source, "parallel.tp", f"tp ({p.tp}) does not divide the key/value heads "
                         f"({m.kv_heads}) of {m.name}; allowed: a divisor of {m.kv_heads}")
    if m.layers % p.pp:
        raise InputError(source, "parallel.pp", f"pp ({p.pp}) does not divide the {m.layers} layers "
                         f"of {m.name}; allowed: a divisor of {m.layers}")
    if p.sequence_parallel and p.tp == 1:
        raise InputError(source, "parallel.sequence_parallel", "needs tp > 1")
    if m.position is Position.LEARNED and s.training.seq_len > m.max_positions:
        raise InputError(source, "training.seq_len", f"{s.training.seq_len} > the {m.max_positions} "
                         f"learned positions of {m.name}")


def _check_precision(s: Scenario, source: Path) -> None:
    gpu = s.cluster.gpu
    if s.training.precision == "bf16" and gpu.bf16_flops == 0:
        raise InputError(source, "training.precision", f"{gpu.name} has no bf16; allowed: fp16, fp32")


def _check_engine_rules(s: Scenario, source: Path) -> None:
    dp = s.parallel.dp
    if s.zero is not None:
        z = s.zero
        if z.stage >= ZeroStage.GRADIENTS and s.parallel.pp > 1:
            raise InputError(source, "zero.stage", f"ZeRO-{int(z.stage)} is incompatible with pipeline "
                             f"parallelism (pp = {s.parallel.pp}) in DeepSpeed; allowed: 0, 1")
        if dp % z.zero_hpz_partition_size:
            raise InputError(source, "zero.zero_hpz_partition_size", f"{z.zero_hpz_partition_size} "
                             f"does not divide the data-parallel degree {dp}")
        nvme = OffloadDevice.NVME in (z.offload_optimizer.device, z.offload_param.device)
        if nvme and s.cluster.host.nvme_bandwidth == 0:
            raise InputError(source, "zero.offload_optimizer", f"NVMe offload, but cluster "
                             f"{s.cluster.name} gives no host.nvme_bandwidth_GBps")
    if s.fsdp is not None:
        f = s.fsdp
        if dp % f.replicate_degree:
            raise InputError(source, "fsdp.replicate_degree", f"{f.replicate_degree} does not divide "
                             f"the data-parallel degree {dp}")
        shard = dp // f.replicate_degree
        k = f.reshard_after_forward
        if not isinstance(k, bool) and shard % k:
            raise InputError(source, "fsdp.reshard_after_forward", f"{k} does not divide the shard "
                             f"group size {shard}")
