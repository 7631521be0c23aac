"""Model-state memory per GPU under ZeRO, in three accounting conventions.

Conventions (bytes per parameter, mixed-precision Adam):
- PAPER: ZeRO paper (Rajbhandari et al., arXiv 1910.02054, Sec. 3.1 and Fig. 1):
  2 (fp16 params) + 2 (fp16 grads) + K (optimizer: fp32 params, m, v; K = 12).
- LECTURE: the CMU 11-868 slides (reference/000_*.txt Sec. 1.2): 20 bytes, i.e. the
  paper's formula with M = 16 because the fp32 gradient copy counts as optimizer state.
- DEEPSPEED: what DeepSpeed's own estimators count
  (`estimate_zero2_model_states_mem_needs`: 2 Psi + 18 Psi / N, "2_grads_16bit +
  4_grads_32bit + 4_params_32bit + 8_optimizer_states_32bit";
  `estimate_zero3_model_states_mem_needs`: 4 * largest_layer + 18 Psi / N, and
  4 * largest_layer + 2 Psi / N with the optimizer offloaded, in
  deepspeed/runtime/zero/stage_1_and_2.py and stage3.py). At stage 3 the 18 B/param must
  hold the 16-bit param and grad partitions (2 + 2, the offload formula shows the former),
  which leaves 14 B for the optimizer column instead of 16: the estimator does not count
  all of the fp32 gradient, which stage3.py builds one sub-group at a time. DeepSpeed
  has no estimator for stages 0 and 1; we derive them from what the engine allocates:
  16-bit params and grads (2 + 2), fp32 master params (4), Adam m and v (8) and the
  fp32 gradient partition (4) -> 20 Psi at stage 0 and 4 Psi + 16 Psi / N at stage 1.
- ALLOCATED: what the engine holds (the DES's view): as DEEPSPEED, but at stage 3 the
  full 4 B/param fp32 gradient (16 B optimizer column), i.e. 20 Psi / N + 4 largest_layer;
  it assumes the whole partition is one sub-group (sub_group_size >= Psi / N, default 1e9).
Stage s shards: s >= 1 optimizer states, s >= 2 gradients, s >= 3 parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.core.enums import Convention, ZeroStage


@dataclass(frozen=True, slots=True)
class ModelStateBytes:
    """Model-state bytes on one GPU, and what offload moved to host memory."""

    params: float
    grads: float
    optimizer: float
    host: float = 0.0

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def bytes_per_param(convention: Convention, k: float = 12.0,
                    stage: ZeroStage = ZeroStage.NONE) -> tuple[float, float, float]:
    """(param, grad, optimizer) bytes per parameter before sharding."""
    if convention is Convention.PAPER:
        return 2.0, 2.0, float(k)
    if convention is Convention.DEEPSPEED and stage >= ZeroStage.PARAMETERS:
        return 2.0, 2.0, 14.0  # estimate_zero3_model_states_mem_needs: 18 B/param in all
    return 2.0, 2.0, 16.0  # fp32 master 4 + Adam m, v 8 + fp32 grads 4 count as optimizer


def shard_divisors(dp: float, stage: ZeroStage) -> tuple[float, float, float]:
    """What (params, grads, optimizer states) are divided by: dp once `stage` shards them."""
    return (dp if stage >= ZeroStage.PARAMETERS else 1, dp if stage >= ZeroStage.GRADIENTS else 1,
            dp if stage >= ZeroStage.OPTIMIZER else 1)


def model_state_bytes(n_params: float, dp: int, stage: ZeroStage,
                      convention: Convention = Convention.PAPER, *, k: float = 12.0,
                      largest_module_params: float = 0.0, offload_optimizer: bool = False,
                      offload_params: bool = False) -> ModelStateBytes:
    """Per-GPU model states: (2 + 2 + K) Psi with each term / dp once `stage` shards it.

    ZeRO paper Fig. 1: Psi = 7.5B, N = 64 -> 120 / 31.4 / 16.6 / 1.9 GB.
    DEEPSPEED and ALLOCATED add 4 * largest_module_params at stage 3 (a gathered 16-bit
    param and grad of the largest module, as `estimate_zero3_model_states_mem_needs` does);
    DEEPSPEED counts 14 optimizer bytes at stage 3, as that estimator's 18 B/param implies.
    Offload (ZeRO-Offload, arXiv 2101.06840 Sec. 4): the optimizer states move to host; at
    stage >= 2 so do the reduced gradient partitions (DeepSpeed copies them D2H as they are
    reduced); `offload_params` (stage 3 only) moves the 16-bit parameter partitions too.
    DES twin: the model-state allocations of the memory pools in the simulator.
    """
    if dp < 1:
        raise ValueError(f"dp must be >= 1, got {dp}")
    p_b, g_b, o_b = bytes_per_param(convention, k, stage)
    p_div, g_div, o_div = shard_divisors(dp, stage)
    params, grads, optim = p_b * n_params / p_div, g_b * n_params / g_div, o_b * n_params / o_div
    if convention in (Convention.DEEPSPEED, Convention.ALLOCATED) and stage >= ZeroStage.PARAMETERS:
        params += 4.0 * largest_module_params
    host = 0.0
    if offload_optimizer:
        host, optim = optim, 0.0
        if stage >= ZeroStage.GRADIENTS:
            host, grads = host + grads, 0.0
    if offload_params:
        if stage < ZeroStage.PARAMETERS:
            raise ValueError("offload_params needs ZeRO stage 3")
        shard = p_b * n_params / dp
        host, params = host + shard, params - shard
    return ModelStateBytes(params=params, grads=grads, optimizer=optim, host=host)


def model_state_bytes_per_param(dp: float, stage: ZeroStage,
                                convention: Convention = Convention.PAPER, k: float = 12.0) -> float:
    """Model-state bytes per parameter on one GPU; dp may be math.inf for the limit.

    The largest-module term of the DeepSpeed conventions is left out (it needs a shape).
    """
    p_b, g_b, o_b = bytes_per_param(convention, k, stage)
    p_div, g_div, o_div = shard_divisors(dp, stage)
    return p_b / p_div + g_b / g_div + o_b / o_div


def largest_trainable_params(memory_bytes: float, dp: float, stage: ZeroStage,
                             convention: Convention = Convention.PAPER, k: float = 12.0) -> float:
    """Largest Psi whose model states fit: memory / bytes-per-param (ZeRO paper Table 1).

    32 GB V100: 2B for DP at any N; ZeRO-1 -> 8B and ZeRO-2 -> 16B as N -> inf;
    ZeRO-3 2.048T at N = 1024. dp = math.inf gives the limit (inf for ZeRO-3).
    Model states only: activations and buffers reduce it further.
    """
    per_param = model_state_bytes_per_param(dp, stage, convention, k)
    return math.inf if per_param == 0 else memory_bytes / per_param


def zero_buffer_bytes(stage: ZeroStage, *, reduce_bucket_size: float, overlap_comm: bool,
                      prefetch_bucket_size: float = 0.0, max_live_parameters: float = math.inf,
                      grad_bytes: int = 2) -> float:
    """Temporary communication buffers DeepSpeed allocates (elements -> bytes).

    Stages 1-2 (stage_1_and_2.py): the IPG gradient bucket of `reduce_bucket_size`
    elements, doubled when `overlap_comm` (double buffer). Stage 3 (stage3.py,
    partitioned_param_coordinator.py): the IPG bucket plus parameters gathered ahead by
    prefetch, at most min(prefetch_bucket_size, max_live_parameters) elements. The
    gathered parameters of the running module are in the 4*largest_layer term of the
    DeepSpeed convention. ZeRO paper Sec. 6.2 ("constant-size buffers").
    """
    if stage == ZeroStage.NONE:
        return 0.0
    ipg = reduce_bucket_size * grad_bytes
    if stage < ZeroStage.PARAMETERS:
        return ipg * (2 if overlap_comm else 1)
    return ipg + min(prefetch_bucket_size, max_live_parameters) * 2


def fused_flat_buffer_bytes(n_params: float, bytes_per_element: int = 4) -> float:
    """One flat fp32 buffer of all gradients (fused all-reduce / norm): 4 Psi.

    ZeRO paper Sec. 3.2: a 1.5B model needs a 6 GB fp32 buffer.
    """
    return bytes_per_element * n_params


def fragmentation_bytes(allocated_bytes: float, fraction: float) -> float:
    """Allowance for allocator fragmentation: `fraction` of the allocated bytes.

    The ZeRO paper (Sec. 3.2) reports over 30% of memory unusable in extreme cases; the
    right fraction depends on the allocator and the run, so the caller chooses it.
    """
    if not 0 <= fraction < 1:
        raise ValueError(f"fragmentation fraction must be in [0, 1), got {fraction}")
    return allocated_bytes * fraction
