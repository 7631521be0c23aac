"""ZeRO++ communication volumes (Wang et al., arXiv 2306.10209; DeepSpeed zeropp.md).

Baseline ZeRO-3 moves a 16-bit copy of the model (M = 2 Psi bytes) three times per
step: forward all-gather, backward all-gather, gradient reduce-scatter. ZeRO++:
- qwZ: the forward all-gather carries int8 weights (M/2) plus one fp32 scale per block;
- hpZ: a secondary copy of the parameters sharded inside each node serves the backward
  all-gather, so it never crosses nodes (costs 2 Psi / hpz bytes of memory per GPU);
- qgZ: gradients travel as int4 through a two-hop all-to-all instead of a
  reduce-scatter (M/4 across nodes in the paper's accounting).
Cross-node: 3M -> 0.5M + 0 + 0.25M = 0.75M, the paper's 4x reduction.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ZeroPPVolume:
    """Cross-node bytes per step in units of the paper's accounting (per model copy)."""

    forward_all_gather: float
    backward_all_gather: float
    gradient_reduction: float

    @property
    def total(self) -> float:
        return self.forward_all_gather + self.backward_all_gather + self.gradient_reduction


def zero3_cross_node_volume(n_params: float) -> ZeroPPVolume:
    """Baseline ZeRO-3: M each for forward AG, backward AG and reduce-scatter, M = 2 Psi."""
    m = 2.0 * n_params
    return ZeroPPVolume(m, m, m)


def zeropp_cross_node_volume(n_params: float, *, quantized_weights: bool = True,
                             hierarchical_partition: bool = True,
                             quantized_gradients: bool = True,
                             block_size: int = 256) -> ZeroPPVolume:
    """ZeRO++ with each of qwZ / hpZ / qgZ switchable; qwZ adds 4 B of scale per block."""
    m = 2.0 * n_params
    fwd = (n_params * 1.0 + 4.0 * n_params / block_size) if quantized_weights else m
    bwd = 0.0 if hierarchical_partition else fwd
    grad = m / 4 if quantized_gradients else m
    return ZeroPPVolume(fwd, bwd, grad)


def hpz_secondary_bytes(n_params: float, hpz_partition_size: int) -> float:
    """Extra memory per GPU for the hpZ secondary shard: 2 Psi / hpz."""
    return 2.0 * n_params / hpz_partition_size


def qgz_all_to_all_bytes(n_params: float, ranks_per_node: int, nodes: int) -> tuple[float, float]:
    """(intra-node, inter-node) bytes one rank sends for qgZ's int4 two-hop all-to-all
    (reference 1.6): Psi x 0.5 B x (n_l-1)/n_l, then (Psi/n_l) x 0.5 B x (N-1)/N."""
    intra = n_params * 0.5 * (ranks_per_node - 1) / ranks_per_node
    inter = n_params / ranks_per_node * 0.5 * (nodes - 1) / nodes
    return intra, inter
