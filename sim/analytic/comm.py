"""Collective times (alpha-beta) and ZeRO communication volumes, paper vs as implemented.

Times: n ranks, S bytes (the full buffer: input of an all-reduce / reduce-scatter, output
of an all-gather), B = achievable per-rank unidirectional bandwidth (bytes/s), alpha =
per-step latency (s). Formulas: reference/engines-and-costmodels.md 3.2-3.4 (Thakur et
al. 2005; Patarasuk & Yuan 2009; NCCL src/graph/tuning.cc for step counts).
DES twins: the collective processes of the simulator (equal when links are uncontended).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.core.enums import ZeroStage


def ring_all_reduce_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """2(n-1) alpha + 2(n-1)/n * S/B: reduce-scatter then all-gather around a ring."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * latency + 2 * (n - 1) / n * nbytes / bandwidth


def ring_all_gather_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """(n-1) alpha + (n-1)/n * S/B, S = the gathered output."""
    if n <= 1:
        return 0.0
    return (n - 1) * latency + (n - 1) / n * nbytes / bandwidth


def ring_reduce_scatter_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """(n-1) alpha + (n-1)/n * S/B, S = the full input."""
    return ring_all_gather_time(nbytes, n, bandwidth, latency)


def tree_all_reduce_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """Double binary tree (NCCL): 2 log2(n) alpha + 2 S/B.

    NCCL models tree all-reduce algbw as 0.5 x busbw (tuning.cc), so the bandwidth term
    is 2 S/B: the same order as the ring, with logarithmic latency.
    """
    if n <= 1:
        return 0.0
    return 2 * math.log2(n) * latency + 2 * nbytes / bandwidth


def broadcast_time(nbytes: float, n: int, bandwidth: float, latency: float,
                   pipelined: bool = True) -> float:
    """Broadcast or reduce of S bytes. Pipelined chain (NCCL ring): (n-1) alpha + S/B;
    binomial tree: log2(n) (alpha + S/B)."""
    if n <= 1:
        return 0.0
    if pipelined:
        return (n - 1) * latency + nbytes / bandwidth
    return math.log2(n) * (latency + nbytes / bandwidth)


def all_to_all_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """Direct pairwise exchange of S bytes per rank: (n-1) alpha + (n-1)/n * S/B."""
    return ring_all_gather_time(nbytes, n, bandwidth, latency)


def hierarchical_all_reduce_time(nbytes: float, ranks_per_node: int, nodes: int, *,
                                 intra_bandwidth: float, intra_latency: float,
                                 inter_bandwidth: float, inter_latency: float) -> float:
    """Two-level all-reduce: intra-node reduce-scatter, inter-node all-reduce of the S/p
    shard (each GPU on its own NIC), intra-node all-gather (reference 3.4):
    (p-1)/p S/B_intra + 2(N-1)/N (S/p)/B_nic + (p-1)/p S/B_intra + latencies."""
    p = ranks_per_node
    return (ring_reduce_scatter_time(nbytes, p, intra_bandwidth, intra_latency)
            + ring_all_reduce_time(nbytes / p, nodes, inter_bandwidth, inter_latency)
            + ring_all_gather_time(nbytes, p, intra_bandwidth, intra_latency))


@dataclass(frozen=True, slots=True)
class Volume:
    """Bytes one rank sends per optimizer step, by collective kind."""

    all_reduce: float = 0.0
    reduce_scatter: float = 0.0
    reduce: float = 0.0
    all_gather_forward: float = 0.0
    all_gather_backward: float = 0.0
    all_gather_after_step: float = 0.0

    @property
    def total(self) -> float:
        return (self.all_reduce + self.reduce_scatter + self.reduce + self.all_gather_forward
                + self.all_gather_backward + self.all_gather_after_step)


def zero_volume_paper(n_params: float, dp: int, stage: ZeroStage, *, grad_accum: int = 1,
                      bytes_per_element: int = 2) -> Volume:
    """The ZeRO paper / lecture schedule (arXiv 1910.02054 Sec. 7; reference/000 Sec. 3.1).

    Per rank, x (N-1)/N: DP all-reduce 2 Psi; ZeRO-1 reduce-scatter Psi + all-gather Psi;
    ZeRO-2 per-segment reduce (a reduce-scatter in volume) Psi + all-gather Psi; ZeRO-3
    forward gather Psi + backward gather Psi + reduce Psi. Gradients are sharded from
    stage 2 on, so stages 2-3 reduce every micro-step; stage 3 also gathers every
    micro-step. Stages 0-1 reduce once per step.
    """
    f = (dp - 1) / dp * n_params * bytes_per_element
    g = grad_accum
    if stage == ZeroStage.NONE:
        return Volume(all_reduce=2 * f)
    if stage == ZeroStage.OPTIMIZER:
        return Volume(reduce_scatter=f, all_gather_after_step=f)
    if stage == ZeroStage.GRADIENTS:
        return Volume(reduce=g * f, all_gather_after_step=f)
    return Volume(all_gather_forward=g * f, all_gather_backward=g * f, reduce_scatter=g * f)


def zero_volume_deepspeed(n_params: float, dp: int, stage: ZeroStage, *, grad_accum: int = 1,
                          bytes_per_element: int = 2, reduce_scatter: bool = True,
                          use_multi_rank_bucket_allreduce: bool = True) -> Volume:
    """DeepSpeed as implemented (stage_1_and_2.py, stage3.py; reference 1.3-1.5).

    Stage 0: bucketed all-reduce at the accumulation boundary, 2 Psi.
    Stages 1-2: each gradient bucket is all-reduced (default
    `use_multi_rank_bucket_allreduce`), 2 Psi, or reduced per destination rank (Psi in
    volume) when that flag is off; `reduce_scatter=False` is a plain all-reduce. ZeRO-2
    reduces every micro-step, ZeRO-1 only at the boundary. After the step one
    all_gather_into_tensor of the 16-bit partition: Psi. So 3 Psi, not the paper's 2 Psi.
    Stage 3: per micro-step forward and backward gathers and one reduce-scatter, Psi each
    (persistent small parameters, gathered once per step, are ignored here).
    """
    f = (dp - 1) / dp * n_params * bytes_per_element
    if stage == ZeroStage.NONE:
        return Volume(all_reduce=2 * f)
    if stage == ZeroStage.PARAMETERS:
        g = grad_accum
        return Volume(all_gather_forward=g * f, all_gather_backward=g * f, reduce_scatter=g * f)
    reductions = grad_accum if stage == ZeroStage.GRADIENTS else 1
    if reduce_scatter and not use_multi_rank_bucket_allreduce:
        return Volume(reduce=reductions * f, all_gather_after_step=f)
    return Volume(all_reduce=reductions * 2 * f, all_gather_after_step=f)


def ddp_volume(n_params: float, dp: int, *, bytes_per_element: int = 2) -> Volume:
    """PyTorch DDP (and ZeroRedundancyOptimizer's gradient half): bucketed all-reduce of
    all gradients once per step (no_sync during accumulation), 2 Psi (N-1)/N."""
    return Volume(all_reduce=2 * (dp - 1) / dp * n_params * bytes_per_element)


def flat_padded(n_params: int, dp: int, alignment: int = 2) -> int:
    """DeepSpeed ZeRO-1/2 pad the flat 16-bit buffer to a multiple of alignment x dp
    elements (`nccl_start_alignment_factor` = 2, stage_1_and_2.py) before partitioning."""
    unit = alignment * dp
    return -(-n_params // unit) * unit


def tensor_padded(numel: int, dp: int) -> int:
    """DeepSpeed ZeRO-3 partitions each tensor into dp equal pieces of ceil(numel / dp)."""
    return -(-numel // dp) * dp


def dim0_padded(shape: tuple[int, ...], dp: int) -> int:
    """FSDP2 shards dim 0 with torch.chunk, padded to a multiple of dp rows."""
    rows = -(-shape[0] // dp) * dp
    rest = 1
    for d in shape[1:]:
        rest *= d
    return rows * rest
