"""Training FLOPs: per layer, per token, per step; Megatron's formulas for papers; MFU.

Conventions (reference/engines-and-costmodels.md 6.5): a Linear of in x out on T tokens
costs 2 T in out forward and 4 T in out backward (input grad + weight grad); attention
scores and values cost 4 s^2 a d per sequence forward (QK^T and AV, the full matrix as
PaLM and Megatron count it; causal kernels skip about half). Model FLOPs count one
forward and one backward; hardware FLOPs add what recomputation runs again.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.analytic import op_sac
from sim.analytic.params import active_params, attention_params, expert_params
from sim.core.enums import Recompute
from sim.core.model import ModelSpec, module_tree


@dataclass(frozen=True, slots=True)
class LayerFlops:
    """FLOPs of one transformer block for one micro-batch."""

    forward: float
    backward_input: float   # activation gradients (dgrad)
    backward_weight: float  # weight gradients (wgrad)
    attention_core_forward: float  # the part selective recompute re-runs

    @property
    def backward(self) -> float:
        return self.backward_input + self.backward_weight


def layer_flops(m: ModelSpec, seq_len: int, batch: int, *, causal: bool = False) -> LayerFlops:
    """Block FLOPs: GEMMs on the active parameters (top-k experts + router) plus the
    attention core, 4 s^2 a d b forward (x 1/2 if causal). Backward: GEMMs 2x forward,
    split evenly into dgrad and wgrad; attention core backward 2x forward, all dgrad."""
    tokens = seq_len * batch
    gemm_params = attention_params(m) + expert_params(m) * min(m.experts_per_token, m.experts)
    if m.experts > 1:
        gemm_params += m.hidden * m.experts  # router
    gemm = 2.0 * tokens * gemm_params
    core = 4.0 * seq_len**2 * m.heads * m.head_dim * batch * (0.5 if causal else 1.0)
    return LayerFlops(forward=gemm + core, backward_input=gemm + 2 * core,
                      backward_weight=gemm, attention_core_forward=core)


def model_flops_per_token(m: ModelSpec, seq_len: int, *, causal: bool = False) -> float:
    """6 N_active + 12 L a d s (PaLM, arXiv 2204.02311 App. B), per trained token.

    The 6 N term includes the embedding matrix, as PaLM does; `step_flops` uses it. With
    LoRA the frozen weights compute no weight gradient: 4 N_active (forward and input
    gradient) + 6 N_adapters.
    """
    attention = 12.0 * m.layers * m.heads * m.head_dim * seq_len * (0.5 if causal else 1.0)
    if m.lora is not None:
        active = min(m.experts_per_token, m.experts) / m.experts     # an expert's adapters see T k / E tokens
        adapters = sum(t.numel * (active if mod.expert is not None else 1.0)
                       for mod in module_tree(m) for t in mod.tensors if t.trainable)
        return 4.0 * active_params(m) + 6.0 * adapters + attention
    return 6.0 * active_params(m) + attention


def step_flops(m: ModelSpec, seq_len: int, global_batch: int, *,
               recompute: Recompute = Recompute.NONE, causal: bool = False,
               recomputed_layers: int | None = None) -> tuple[float, float]:
    """(model FLOPs, hardware FLOPs) of one optimizer step over `global_batch` sequences.

    Hardware FLOPs add the recomputed forward: the whole block forward for full
    recompute (of `recomputed_layers` blocks, default all), the attention core for
    selective (Korthikanti et al. Sec. 5), every second matmul for torchtitan's per-op
    selective policy (sim.analytic.op_sac).
    """
    tokens = seq_len * global_batch
    model = model_flops_per_token(m, seq_len, causal=causal) * tokens
    per_seq = layer_flops(m, seq_len, 1, causal=causal)
    if recompute is Recompute.FULL:
        extra = per_seq.forward
    elif recompute is Recompute.SELECTIVE:
        extra = per_seq.attention_core_forward
    elif recompute is Recompute.SELECTIVE_OP:
        extra = op_sac.recomputed_flops_per_token(m) * seq_len
    else:
        extra = 0.0
    layers = m.layers if recomputed_layers is None or recompute is not Recompute.FULL else recomputed_layers
    return model, model + extra * layers * global_batch


def megatron_flops_per_iteration(batch: int, seq_len: int, layers: int, hidden: int,
                                 vocab: int) -> float:
    """Megatron SC21 Eq. 3 (arXiv 2104.04473): 96 B s l h^2 (1 + s/(6h) + V/(16 l h)).

    Counts the extra forward of full recomputation (hence 96, not 72); the figure papers
    divide by time x GPUs to report 'achieved TFLOP/s per GPU'.
    """
    return 96.0 * batch * seq_len * layers * hidden**2 * (
        1 + seq_len / (6 * hidden) + vocab / (16 * layers * hidden))


def korthikanti_model_flops(batch: int, seq_len: int, layers: int, hidden: int,
                            vocab: int) -> float:
    """Model FLOPs of Korthikanti et al. (arXiv 2205.05198 Sec. 6.3):
    72 B s l h^2 (1 + s/(6h) + V/(12 l h)); MFU = this / (t N peak)."""
    return 72.0 * batch * seq_len * layers * hidden**2 * (
        1 + seq_len / (6 * hidden) + vocab / (12 * layers * hidden))


def mfu(model_flops: float, step_time_s: float, gpus: int, peak_flops: float) -> float:
    """Model FLOPs utilisation: model FLOPs / (step time x GPUs x dense peak)."""
    return model_flops / (step_time_s * gpus * peak_flops)
