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

from sim.analytic.comm import tensor_padded

QWZ_GROUP = 8000        # DeepSpeed partition_parameters.py CUDAQuantizer.target_group_size
QGZ_GROUP = 2048        # elements per int4 scale in all_to_all_quant_reduce (an estimate of its groups)
SCALE_BYTES = 4.0       # one fp32 scale per group


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


def zeropp_implemented_volume(tensors: list[tuple[int, bool]], dp: int, *, grad_accum: int, elem: int,
                              persistence_threshold: int, recompute_share: float, quantized_weights: bool,
                              hierarchical: bool, quantized_gradients: bool, node_ranks: int, nodes: int,
                              grad_shapes: list[tuple[int, int]]) -> dict[str, float]:
    """Bytes per rank per step by collective kind of DeepSpeed ZeRO-3 with ZeRO++ as
    sim.engines.zeropp simulates it (every module gathered for each use, no reuse):
    gathers over dp (int8 + fp32 scales with qwZ), with hpZ all but each module's first
    gather of the step over the node's `node_ranks`, and with qgZ each quantizable gradient tensor as
    int4 through an all-to-all in the node and one across the `nodes`, the rest
    reduce-scattered (on one node, all of them: qgZ needs more than one). `grad_shapes`:
    (numel, dimensions) of the tensors that get gradients (all, or LoRA's adapters); 1-D ones
    (norms, biases) are never quantized. The persistent parameters' gather after the step is
    16-bit over dp."""
    def once(nbytes: float, n: int) -> float:
        return (n - 1) / n * nbytes if n > 1 else 0.0

    per_element = (1.0 + SCALE_BYTES / QWZ_GROUP) if quantized_weights else float(elem)
    gathered = [tensor_padded(n, dp) for n, _ in tensors if n > persistence_threshold]
    in_blocks = sum(tensor_padded(n, dp) for n, block in tensors if block and n > persistence_threshold)
    persistent = sum(tensor_padded(n, dp) for n, _ in tensors if n <= persistence_threshold)
    forward = sum(gathered) * per_element
    backward = (sum(gathered) + recompute_share * in_blocks) * per_element
    if hierarchical:   # only each module's first gather of the step (micro-step 0's forward) crosses nodes
        gathers = once(forward, dp) + once((grad_accum - 1) * forward + grad_accum * backward, node_ranks)
    else:
        gathers = grad_accum * once(forward + backward, dp)
    out = {"all_gather": gathers + once(elem * persistent, dp)}
    grads = [n for n, _ in grad_shapes]
    if not quantized_gradients or nodes <= 1:     # qgZ needs more than one node
        out["reduce_scatter"] = grad_accum * once(elem * sum(tensor_padded(n, dp) for n in grads), dp)
        return out
    int4 = 0.5 + SCALE_BYTES / QGZ_GROUP
    quantized = [n for n, dims in grad_shapes if dims > 1 and n % (2 * dp) == 0]
    plain = [n for n, dims in grad_shapes if not (dims > 1 and n % (2 * dp) == 0)]
    out["all_to_all"] = grad_accum * sum(once(int4 * n, node_ranks) + once(int4 * n / node_ranks, nodes)
                                         for n in quantized)
    out["reduce_scatter"] = grad_accum * once(elem * sum(tensor_padded(n, dp) for n in plain), dp)
    return out
