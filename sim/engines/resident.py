"""What each engine keeps resident per rank, on the device and in host memory.

One source for the planners (the DES's memory pools start from `device`) and for the
scenario's own row of `zerosim memory`, so that the two always agree. Bytes follow each
engine's code (reference/engines-and-costmodels.md sections 1-2):

- DDP (torch/nn/parallel/distributed.py; autocast keeps fp32 states): fp32 parameters and
  gradients, the reducer's flat gradient buckets (a second fp32 copy of every gradient,
  `gradient_as_bucket_view=False`), Adam m and v; ZeroRedundancyOptimizer keeps m and v
  only for the tensors its greedy partition gives the rank.
- DeepSpeed ZeRO-0/1/2 (stage_1_and_2.py): 16-bit parameters, 16-bit gradients (the
  partition at stage 2), fp32 master partition and Adam m, v (12 B per partitioned
  parameter), the IPG bucket (doubled with overlap_comm). With ZeRO-Offload the fp32
  master, m, v and the fp32 gradient partition live in pinned host memory (16 B).
- DeepSpeed ZeRO-3 (stage3.py): 16-bit parameter and gradient partitions (each tensor
  padded to a multiple of dp), persistent parameters in full, fp32 master + Adam (12 B),
  the IPG bucket; offload moves the optimizer (16 B with the fp32 gradients) and, with
  `offload_param`, the 16-bit parameter partition to the host.
- FSDP2 (_fully_shard): fp32 parameter, gradient and Adam shards (dim 0 padded to a
  multiple of dp rows); `cpu_offload` keeps all of them on the host.
- The paper schedules: (2 + 2 + 12) B per parameter, each term / dp once its stage shards it.
- Every engine: the model's module buffers (sim.core.model.module_buffers).

Each engine module computes its own resident allocations (its `EngineModel.resident`);
sim.engines.plan.resident_memory dispatches to them, for the planners and `zerosim memory`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.analytic.placement import TensorGroup, frozen_numel
from sim.core.model import module_buffers
from sim.core.units import BYTES_PER_ELEMENT
from sim.engines.schedule import Alloc, Mem
from sim.inputs.scenario import Scenario


@dataclass(frozen=True, slots=True)
class Resident:
    """Allocations that exist before a step starts, on one rank of a pipeline stage."""

    device: tuple[Alloc, ...]
    host: tuple[Alloc, ...]

    def device_bytes(self, category: Mem) -> float:
        return sum(a.nbytes for a in self.device if a.category is category)

    @property
    def host_bytes(self) -> float:
        """Host DRAM (NVMe-resident state, ZeRO-Infinity's, is `nvme_bytes`)."""
        return sum(a.nbytes for a in self.host if a.category is not Mem.NVME)

    @property
    def nvme_bytes(self) -> float:
        return sum(a.nbytes for a in self.host if a.category is Mem.NVME)


def resident(s: Scenario, device: list[Alloc], host: list[Alloc]) -> Resident:
    """An engine's allocations plus the model's module buffers, empty ones left out."""
    buffers = sum(b.numel * b.element_bytes for b in module_buffers(s.model))
    device = [*device, Alloc(Mem.BUFFERS, "module buffers", buffers)]
    return Resident(tuple(a for a in device if a.nbytes > 0), tuple(a for a in host if a.nbytes > 0))


def frozen_base(census: list[TensorGroup], *, value_bytes: float = 2.0) -> list[Alloc]:
    """LoRA's frozen base: no gradient, no optimizer state; 16-bit for the torch engines (PEFT
    recipes load the base in bf16), the training dtype under DeepSpeed (its engine casts the
    whole module)."""
    frozen = frozen_numel(census)
    return [Alloc(Mem.PARAMS, "frozen base (LoRA)", value_bytes * frozen)] if frozen else []


def half_bytes(s: Scenario) -> int:
    """Bytes of a training-precision value (2 in mixed precision, 4 in fp32)."""
    return BYTES_PER_ELEMENT[s.training.precision.value]
