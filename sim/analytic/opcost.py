"""Cost of one scheduled op in isolation (no contention): the terms the DES plays out.

Compute: roofline, max(FLOPs / (peak x GEMM efficiency), bytes / (HBM x efficiency)).
Collectives: a list of phases, each a latency and bus bytes moved at the group's bus
bandwidth, min(B_intra, p x B_nic) when the group spans nodes with p members per node
(reference 3.4), times the share the chosen NCCL protocol reaches: NCCL's own choice of
ring or tree and LL / LL128 / Simple, with its latencies (sim.analytic.nccl,
src/graph/tuning.cc). The DES runs the same phases with link
bandwidth shared among concurrent transfers; `isolated_time` is their closed form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from sim.analytic import nccl
from sim.core.enums import Algorithm, Coll
from sim.core.specs import AioConfig, ClusterSpec, Curve

ADAM_BYTES_PER_PARAM = 30.0  # read p, g, m, v (16 B), write p, m, v (12 B), write 16-bit p (2 B); reference 5


class LinkClass(StrEnum):
    NVLINK = "nvlink"   # the GPU's intra-node port
    NIC = "nic"         # the GPU's share of the node's NICs
    PCIE_UP = "pcie up"      # the GPU's own PCIe x16 link to its switch, device -> switch
    PCIE_DOWN = "pcie down"  # and switch -> device


@dataclass(frozen=True, slots=True)
class CommPhase:
    """latency, then bus_bytes at min over links of (capacity share x multiplier)."""

    latency: float
    bus_bytes: float
    links: tuple[tuple[LinkClass, float], ...]  # (link class, multiplier on its share)
    rate: float | None = None                   # a measured bus bandwidth (calibration) instead


@dataclass(frozen=True, slots=True)
class GroupShape:
    size: int
    nodes: int
    per_node: int   # most members on one node


def compute_time(flops: float, mem_bytes: float, peak_flops: float, matmul_efficiency: float,
                 memory_bandwidth: float, memory_efficiency: float, elementwise_bytes: float = 0.0,
                 overhead: float = 0.0) -> float:
    """Roofline for the GEMMs (the slower of arithmetic and traffic), plus memory-bound
    elementwise kernels (norms, activations, residuals, softmax) at HBM speed, plus a fixed
    per-op overhead (kernel launch / dispatch; 0 unless calibrated)."""
    hbm = memory_bandwidth * memory_efficiency
    return max(flops / (peak_flops * matmul_efficiency), mem_bytes / hbm) + elementwise_bytes / hbm + overhead


UNFUSED_ADAM_BYTES_PER_PARAM = 72.0  # torch Adam's passes, fp32: lerp m (12), v *= b2 (8), v += g^2 (12),
                                     # sqrt v (8), / bias correction (8), + eps (8), p -= m / denom (16)
UNFUSED_ADAM_KERNELS = 7             # those seven passes: kernels per tensor (for-loop) or per foreach call
FOREACH_TENSORS_PER_LAUNCH = 36      # multi_tensor_apply's tensor list depth-4 limit (torch MultiTensorApply.cuh)


def gpu_adam_time(params: float, cluster: ClusterSpec, implementation: str = "fused", tensors: int = 1) -> float:
    """Adam on the device, bandwidth-bound. Fused (DeepSpeed / Megatron FusedAdam, torch
    fused=True): one pass, 30 B of HBM traffic per parameter, its few launches negligible.
    torch's foreach and single-tensor ('for-loop') implementations run the update as seven
    elementwise passes, 72 B per parameter (torch/optim/adam.py `_multi_tensor_adam`,
    `_single_tensor_adam`), and pay the device's per-kernel overhead per launch: seven per
    tensor for the loop, seven per 36 tensors for foreach."""
    gpu = cluster.gpu
    rate = gpu.memory_bandwidth * gpu.memory_bandwidth_efficiency
    if implementation == "fused":
        return params * ADAM_BYTES_PER_PARAM / rate
    return params * UNFUSED_ADAM_BYTES_PER_PARAM / rate + adam_launches(implementation, tensors) * gpu.kernel_overhead


def adam_launches(implementation: str, tensors: int) -> int:
    """Kernel launches of one Adam step over `tensors` parameter tensors (fused: one)."""
    if implementation == "for-loop":
        return UNFUSED_ADAM_KERNELS * tensors
    if implementation == "foreach":
        return UNFUSED_ADAM_KERNELS * -(-tensors // FOREACH_TENSORS_PER_LAUNCH)
    return 1


def cpu_adam_time(params: float, cluster: ClusterSpec, ranks_per_node: int, host_bytes: float = 0.0) -> float:
    """DeepSpeed CPU-Adam: the node's rate is shared by the ranks stepping at once (reference 5),
    a roofline of its cores (`cpu_adam_params_per_s`, measured: ZeRO-Offload Table 4 and the
    cluster files' sources) and of the bytes it moves through DRAM (ADAM_BYTES_PER_PARAM per
    parameter: fp32 master, gradient, m and v read, master, m and v written, the 16-bit copy;
    csrc/adam/cpu_adam_impl.cpp) at `dram_bandwidth_GBps`; the cores bind on every
    catalog host (DGX A100: 1.8 G params/s against 13.7 G from 410 GB/s). `host_bytes` of
    other host-memory traffic at the node's DRAM bandwidth, shared the same way."""
    host = cluster.host
    cores = params / (host.cpu_adam_params_per_s / ranks_per_node)
    dram = params * ADAM_BYTES_PER_PARAM / (host.dram_bandwidth / ranks_per_node)
    return max(cores, dram) + host_bytes / (host.dram_bandwidth / ranks_per_node)


def pcie_bandwidth(cluster: ClusterSpec) -> float:
    """Per-GPU, per-direction pinned copy rate when every GPU behind a switch copies at once."""
    host = cluster.host
    return host.pcie.achievable_bandwidth / host.gpus_per_pcie_switch


def nvme_bandwidth(cluster: ClusterSpec, ranks_per_node: int, *, write: bool, aio: AioConfig | None = None) -> float:
    """One rank's share of the node's NVMe read (or write) bandwidth when every rank swaps
    at once (ZeRO-Infinity's ranks do), at the rate DeepSpeed's `aio` settings reach
    (`aio_efficiency`); a tiny rate where the node has none (never used: NVMe offload is
    refused there)."""
    host = cluster.host
    node = (host.nvme_write_bandwidth or host.nvme_bandwidth) if write else host.nvme_bandwidth
    share = max(node, 1.0) / max(1, ranks_per_node)
    return share * aio_efficiency(aio, cluster, ranks_per_node) if aio is not None else share


def aio_efficiency(aio: AioConfig, cluster: ClusterSpec, ranks_per_node: int) -> float:
    """The share of the node's NVMe bandwidth that `aio`'s settings reach, relative to
    DeepSpeed's defaults (the catalog's bandwidth is what ZeRO-Infinity measured with them,
    Fig. 2b). A device with a fixed per-request latency L and bandwidth B reaches
    x / (1 + x) of B with x = bytes in flight / (B L) (Little's law, smoothed at the
    knee): B L is the data that must be in flight to keep it busy. The node's ranks submit
    together: x = ranks x queue_depth x block_size x intra_op_parallelism / (B L), halved
    in flight without overlap_events. At the defaults (8 x 1 MiB per rank) a DGX-2 (25 GB/s,
    100 us: 2.5 MB to fill) is at x = 54; one 128 KiB request per rank reaches about half.
    A public queue-depth sweep of a PCIe 4.0 NVMe drive (0xBakeer/deepseek-v41-flash-spark#2)
    rises 8x from depth 1 to 128 at 64 KiB reads, the shape this curve has."""
    host = cluster.host
    knee = max(host.nvme_bandwidth, 1.0) * host.nvme_latency

    def reached(in_flight: float) -> float:
        x = ranks_per_node * in_flight / knee
        return x / (1.0 + x)
    return reached(aio.in_flight) / reached(AioConfig().in_flight)


def copy_time(nbytes: float, direction: str, pageable: bool, cluster: ClusterSpec, ranks_per_node: int,
              aio: AioConfig | None = None, fresh: bool = False) -> float:
    """Closed form of one copy alone: latency + bytes over the rank's PCIe or NVMe share."""
    if direction in ("nvme read", "nvme write"):
        rate = nvme_bandwidth(cluster, ranks_per_node, write=direction == "nvme write", aio=aio)
    else:
        rate = pcie_bandwidth(cluster) * copy_share(pageable, cluster, fresh)
    return cluster.host.pcie.latency + nbytes / rate


def copy_share(pageable: bool, cluster: ClusterSpec, fresh: bool = False) -> float:
    """The fraction of the pinned rate a copy reaches: a pageable buffer is staged through
    the driver's pinned bounce buffer (CUDA C++ Best Practices Guide, "Pinned Memory"). A
    D2H into a tensor it allocates (`.to("cpu")`, torch's cross-dtype copy to the host)
    also takes the first-touch page faults of that memory, and runs at the host's
    `fresh_pageable_d2h` rate, CPU-bound: 1.4 GB/s "Device -> Pageable" against 12.6 GB/s
    pinned on an A100 (pytorch/pytorch#138018); never above the pageable rate."""
    if fresh:
        return min(cluster.host.pcie_pageable_efficiency, cluster.host.fresh_pageable_d2h / pcie_bandwidth(cluster))
    return cluster.host.pcie_pageable_efficiency if pageable else 1.0


def wire_bytes_per_rank(coll: Coll, nbytes: float, n: int) -> float:
    """Bytes one rank sends on average for a collective of buffer S (optimal algorithms):
    all-reduce 2(n-1)/n S; gather, scatter, broadcast, reduce, all-to-all (n-1)/n S."""
    if n <= 1:
        return 0.0
    if coll is Coll.ALL_REDUCE:
        return 2 * (n - 1) / n * nbytes
    if coll is Coll.SEND_RECV:
        return nbytes
    return (n - 1) / n * nbytes


def bus_factor(coll: Coll, n: int) -> float:
    """nccl-tests busbw factor: time = S x factor / busbw (doc/PERFORMANCE.md)."""
    if coll is Coll.ALL_REDUCE:
        return 2 * (n - 1) / n
    if coll in (Coll.BROADCAST, Coll.REDUCE, Coll.SEND_RECV):
        return 1.0
    return (n - 1) / n


def ring_steps(coll: Coll, n: int) -> int:
    """NCCL ring step counts: all-reduce 2(n-1), gather / scatter n-1, others n-1 (chain)."""
    if coll is Coll.SEND_RECV:
        return 1
    return 2 * (n - 1) if coll is Coll.ALL_REDUCE else n - 1


def curve_busbw(curve: Curve, nbytes: float) -> float:
    """A measured curve's bus bandwidth for a message of `nbytes` (sim.inputs.calibration_table):
    interpolated linearly in log(size) between the measured sizes; below the smallest size
    scaled so the time stays that of the smallest (a latency floor); above the largest, the
    largest's."""
    first_size, first_bw = curve[0]
    if nbytes <= first_size:
        return first_bw * nbytes / first_size
    for (s0, b0), (s1, b1) in zip(curve, curve[1:]):
        if nbytes <= s1:
            w = math.log(nbytes / s0) / math.log(s1 / s0)
            return b0 + w * (b1 - b0)
    return curve[-1][1]


def collective_phases(coll: Coll, nbytes: float, g: GroupShape, cluster: ClusterSpec,
                      algorithm: Algorithm = Algorithm.AUTO,
                      busbw_override: float | None = None) -> list[CommPhase]:
    """The phases of one collective on a group of shape `g` (empty for a group of one)."""
    n = g.size
    if n <= 1 or nbytes <= 0:
        return []
    a_intra, a_inter = cluster.node.intra_node.latency, cluster.inter_node.latency
    multi = g.nodes > 1
    measured = cluster.calibration.get(coll.value) if not multi else None
    if measured is not None:   # a calibrated profile: per-op alpha per step and bus bandwidth
        alpha, busbw = measured
        return [CommPhase(ring_steps(coll, n) * alpha, nbytes * bus_factor(coll, n),
                          ((LinkClass.NVLINK, 1.0),), rate=busbw)]
    curve = cluster.calibration_curves.get(coll.value) if not multi else None
    if curve is not None:      # a measured curve: nccl-tests' busbw at this size
        return [CommPhase(0.0, nbytes * bus_factor(coll, n), ((LinkClass.NVLINK, 1.0),),
                          rate=curve_busbw(curve, nbytes))]
    links = ring_links(g, cluster)
    if multi and algorithm is Algorithm.HIERARCHICAL and coll is Coll.ALL_REDUCE and g.per_node > 1:
        p, nodes = g.per_node, g.nodes
        intra = ((LinkClass.NVLINK, 1.0),)
        return [CommPhase((p - 1) * a_intra, (p - 1) / p * nbytes, intra),
                CommPhase(2 * (nodes - 1) * a_inter, 2 * (nodes - 1) / nodes * nbytes / p,
                          ring_links(GroupShape(nodes, nodes, 1), cluster)),
                CommPhase((p - 1) * a_intra, (p - 1) / p * nbytes, intra)]
    all_reduce = coll is Coll.ALL_REDUCE
    steps = ring_steps(coll, n)
    inter_steps = min(steps, (2 if all_reduce else 1) * (g.nodes - 1))
    options = nccl.choices(all_reduce, steps, inter_steps, g.per_node, g.nodes, a_intra / nccl.US, a_inter / nccl.US,
                           tree=algorithm is not Algorithm.RING)
    if algorithm is Algorithm.TREE and all_reduce and multi:
        options = [c for c in options if c.route is nccl.Route.TREE]
    busbw = busbw_override or links_rate(links, cluster)
    ring_bytes = nbytes * bus_factor(coll, n)
    tree_bytes = 2.0 * nbytes
    best = min(options, key=lambda c: c.latency + (tree_bytes if c.route is nccl.Route.TREE else ring_bytes)
               / (busbw * c.bandwidth))
    moved = tree_bytes if best.route is nccl.Route.TREE else ring_bytes
    return [CommPhase(best.latency, moved, tuple((lc, mult * best.bandwidth) for lc, mult in links))]


def ring_links(g: GroupShape, cluster: ClusterSpec) -> tuple[tuple[LinkClass, float], ...]:
    """The ports a ring over `g` moves bytes through: NVLink inside a node; across nodes the
    NICs (p members per node drive p NIC ports at once) and, where a node holds more than
    one member, NVLink for the hops inside it. A group with one member per node never
    touches NVLink: NCCL moves its bytes GPU -> NIC over PCIe (GPUDirect RDMA), as in a
    pipeline send between stages or a data-parallel group when tensor parallelism fills
    the node.

    Bytes to and from a NIC cross the GPU's own PCIe x16 link to its switch both ways (a
    ring sends and receives at once; DGX A100 / H100: each PCIe switch joins two GPUs, their
    two NICs and the CPU uplink), the link the GPU's offload copies cross too
    (`copy_links`): a D2H beside an inter-node collective shares it. Alone, that link
    (PCIe 4.0 x16: 26 GB/s) is faster than the GPU's NIC share (HDR: 25 GB/s line), so it
    changes nothing until a copy runs beside the collective.

    A group over more than two nodes keeps `cluster.fabric_share(nodes)` of its NIC ports'
    two-node rate, on a ring or a tree: its flows share the switch fabric's links
    (ClusterSpec.fabric_share)."""
    if g.nodes <= 1:
        return ((LinkClass.NVLINK, 1.0),)
    p = float(max(g.per_node, 1))
    nic = ((LinkClass.NIC, p * cluster.fabric_share(g.nodes)), (LinkClass.PCIE_UP, p), (LinkClass.PCIE_DOWN, p))
    return nic if g.per_node <= 1 else ((LinkClass.NVLINK, 1.0), *nic)


def copy_links(direction: str) -> tuple[LinkClass, ...]:
    """The GPU's PCIe link a host copy crosses besides its share of the switch's uplink to
    the CPU: device -> host goes up, host -> device down (NVMe swaps: none of the GPU's)."""
    return {"d2h": (LinkClass.PCIE_UP,), "h2d": (LinkClass.PCIE_DOWN,)}.get(direction, ())


def link_capacity(link: LinkClass, cluster: ClusterSpec) -> float:
    """Achievable bytes/s of one GPU's port of this class."""
    if link is LinkClass.NVLINK:
        return cluster.node.intra_node.achievable_bandwidth
    if link in (LinkClass.PCIE_UP, LinkClass.PCIE_DOWN):
        return cluster.host.pcie.achievable_bandwidth
    return cluster.nic_bandwidth_per_gpu


def links_rate(links: tuple[tuple[LinkClass, float], ...], cluster: ClusterSpec) -> float:
    """Bytes/s a transfer alone on `links` reaches: its slowest port, capacity x multiplier."""
    return min(link_capacity(lc, cluster) * mult for lc, mult in links)


def isolated_time(phases: list[CommPhase], cluster: ClusterSpec,
                  busbw_override: float | None = None) -> float:
    """Closed form of a collective with its links to itself: sum of latency + bytes / rate."""
    total = 0.0
    for ph in phases:
        rate = busbw_override or ph.rate or links_rate(ph.links, cluster)
        total += ph.latency + ph.bus_bytes / rate
    return total


def device_op_time(kind: str, *, flops: float, mem_bytes: float, elementwise_bytes: float, params: float,
                   precision: str, cluster: ClusterSpec, ranks_per_node: int, host_bytes: float = 0.0) -> float | None:
    """Duration of an op that uses no shared link: compute, GPU Adam, CPU-Adam (None for
    the others, whose time depends on what shares their links)."""
    gpu = cluster.gpu
    if kind == "compute":
        return compute_time(flops, mem_bytes, gpu.peak_flops(precision), gpu.matmul_efficiency,
                            gpu.memory_bandwidth, gpu.memory_bandwidth_efficiency, elementwise_bytes,
                            gpu.kernel_overhead)
    if kind == "optimizer":
        return gpu_adam_time(params, cluster)
    if kind == "cpu optimizer":
        return cpu_adam_time(params, cluster, ranks_per_node, host_bytes)
    return None
