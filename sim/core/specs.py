"""Hardware specs: frozen dataclasses in SI units, built by `sim.inputs.hardware` from TOML.

Peak figures (datasheet) and achievable fractions (measured) are separate fields, so a
calibration changes a fraction without touching the peak it refers to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any


class IntraNodeTopology(StrEnum):
    """How the GPUs of one node are connected."""

    NVSWITCH = "nvswitch"                  # every GPU reaches every other at full NVLink rate
    HYBRID_CUBE_MESH = "hybrid-cube-mesh"  # DGX-1: NVLink point-to-point, rings via NCCL
    PCIE = "pcie"
    SHARED_MEMORY = "shared-memory"        # CPU processes on one host (gloo)


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """Peak capabilities of one accelerator; efficiencies turn peaks into achieved rates."""

    name: str
    memory: float                       # bytes of device memory
    memory_bandwidth: float             # bytes/s, peak
    bf16_flops: float                   # FLOP/s dense peak; 0 when the GPU has no bf16
    fp16_flops: float                   # FLOP/s dense peak (tensor cores)
    fp32_flops: float                   # FLOP/s dense peak (no TF32)
    fp8_flops: float = 0.0              # FLOP/s dense peak of fp8 (e4m3 / e5m2) tensor cores; 0: none
    matmul_efficiency: float            # fraction of peak reached by large GEMMs
    memory_bandwidth_efficiency: float  # fraction of peak HBM bandwidth reached
    uncertain: tuple[str, ...] = ()     # keys whose value is an estimate (see the file)
    kernel_overhead: float = 0.0        # s added to every kernel (device-side gap / dispatch); calibrated
    sm_count: int = 0                   # streaming multiprocessors (GEMM waves); 0: no SM model (a CPU)
    attention_efficiency: float = 0.0   # fraction of peak of a long fused-attention forward kernel
    attention_backward_efficiency: float = 0.0
    comm_interference: float = 0.0      # c: compute at 1 / (1 + c) of its rate while a collective runs beside it

    def peak_flops(self, precision: str) -> float:
        """Dense peak for a training precision: 'bf16', 'fp16' or 'fp32'."""
        return {"bf16": self.bf16_flops, "fp16": self.fp16_flops, "fp32": self.fp32_flops}[precision]


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkSpec:
    """One direction of a link as seen by one GPU (alpha-beta model)."""

    bandwidth: float   # bytes/s, peak per direction
    efficiency: float  # fraction of `bandwidth` that collectives reach (bus bandwidth)
    latency: float     # s, per step of a collective algorithm

    @property
    def achievable_bandwidth(self) -> float:
        """bytes/s a large transfer reaches: peak x efficiency."""
        return self.bandwidth * self.efficiency


@dataclass(frozen=True, slots=True, kw_only=True)
class HostSpec:
    """The CPU side of a node: DRAM, PCIe to each GPU, CPU-Adam throughput."""

    cpu: str
    cores: int
    dram: float                    # bytes
    dram_bandwidth: float          # bytes/s, theoretical
    pcie: LinkSpec                 # per GPU, per direction, pinned memory
    pcie_pageable_efficiency: float = 0.5  # a pageable copy's rate / a pinned one's (staged by the driver)
    fresh_pageable_d2h: float = 1.4e9  # bytes/s of a D2H into a freshly allocated pageable tensor (`.to("cpu")`):
                                       # CPU-bound (first-touch page faults, the driver's staging memcpy);
                                       # 1.4 GB/s on A100 against 12.6 pinned (pytorch/pytorch#138018)
    gpus_per_pcie_switch: int      # GPUs sharing one uplink to the CPU
    cpu_adam_params_per_s: float   # parameters/s for the whole node (all ranks together)
    nvme_bandwidth: float          # bytes/s per node (reads); 0 when unknown / absent
    nvme_write_bandwidth: float = 0.0   # bytes/s per node; 0: as the reads
    nvme_capacity: float = 0.0     # bytes per node; 0 when unknown / absent
    nvme_latency: float = 100e-6   # s one request takes at queue depth 1, besides its bytes (aio model)
    launch: float = 0.0            # s of host CPU per kernel launch (framework dispatch included)
    collective_launch: float = 0.0  # s of host CPU per collective call (process group + NCCL enqueue)
    zero3_hook: float = 0.0        # s per DeepSpeed ZeRO-3 module hook pair (fetch / release bookkeeping)
    fsdp2_hook: float = 0.0        # s per FSDP2 unit hook pair (unshard / reshard bookkeeping)
    zero3_rank_piece: float = 0.0  # s per (rank, tensor) piece DeepSpeed ZeRO-3 slices in Python when it
                                   # unpacks a coalesced all-gather or packs a reduce-scatter bucket
    synchronous: bool = False      # the 'device' is the host's own thread (a CPU process): host costs
                                   # add to the compute stream instead of running ahead of it


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSpec:
    """One host: its GPUs, how they are connected, its NICs and its CPU side."""

    gpu: GpuSpec
    gpus_per_node: int
    intra_topology: IntraNodeTopology
    intra_node: LinkSpec          # per GPU, per direction
    nics_per_node: int
    host: HostSpec


Curve = tuple[tuple[float, float], ...]
"""A measured collective: (bytes, bus bandwidth in B/s) pairs, sizes increasing."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """A node type and the network between nodes; the node count lives in the scenario."""

    name: str
    node: NodeSpec
    inter_node: LinkSpec          # per NIC, per direction
    uncertain: tuple[str, ...] = ()
    calibration: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Measured collectives inside a node (`zerosim calibrate`): op -> (alpha per step s, busbw B/s)."""
    calibration_curves: dict[str, Curve] = field(default_factory=dict)
    """Or measured curves: op -> ((bytes, busbw B/s), ...) (sim.inputs.calibration_table)."""
    fabric_halving_nodes: float = math.inf
    """Nodes beyond two at which a ring's per-NIC bus bandwidth has fallen to half its two-node
    value (`fabric_share`); inf: a fabric whose rings keep their two-node rate at any size."""

    @property
    def gpu(self) -> GpuSpec:
        return self.node.gpu

    @property
    def gpus_per_node(self) -> int:
        return self.node.gpus_per_node

    @property
    def host(self) -> HostSpec:
        return self.node.host

    def fabric_share(self, nodes: int) -> float:
        """Fraction of the two-node inter-node bus bandwidth a ring spanning `nodes` nodes keeps:
        1 / (1 + (nodes - 2) / fabric_halving_nodes).

        The inter-node efficiency is measured on two nodes (nccl-tests); larger rings cross
        more switch tiers, and their flows, hashed onto shared links, collide (two ring flows
        on one link halve each other: NVIDIA/nccl#307). Published nccl-tests runs fall with
        the node count in this harmonic way: 8 x 100 Gb/s RoCE gave 100, 70, 58 and 40 GB/s
        on 2, 3, 4 and 6 nodes (NVIDIA/nccl-tests#169: a halving count of 2.3-2.8), an
        all-gather on 32 nodes of 8 x 400 Gb/s RoCE 0.5 of line rate against 0.94 on
        two (NVIDIA/nccl#1218, NVIDIA/nccl-tests#290: about 34)."""
        return 1.0 / (1.0 + max(0, nodes - 2) / self.fabric_halving_nodes)

    @property
    def nic_bandwidth_per_gpu(self) -> float:
        """bytes/s of achievable inter-node bandwidth one GPU gets when all GPUs send."""
        return self.inter_node.achievable_bandwidth * self.node.nics_per_node / self.node.gpus_per_node

    def with_gpu(self, **fields: Any) -> ClusterSpec:
        """This cluster with its GPU's `fields` replaced (a fit's trial values, a measured rate)."""
        return replace(self, node=replace(self.node, gpu=replace(self.node.gpu, **fields)))

    def with_host(self, **fields: Any) -> ClusterSpec:
        """This cluster with its host's `fields` replaced."""
        return replace(self, node=replace(self.node, host=replace(self.node.host, **fields)))


DEFAULT_AIO_BLOCK = 1_048_576      # DeepSpeed's aio block_size (swap_tensor/constants.py)
DEFAULT_AIO_QUEUE_DEPTH = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class AioConfig:
    """DeepSpeed's `aio` settings that change the NVMe rate (sim.inputs.aio_config)."""

    block_size: int = DEFAULT_AIO_BLOCK
    queue_depth: int = DEFAULT_AIO_QUEUE_DEPTH
    intra_op_parallelism: int = 1
    overlap_events: bool = True

    @property
    def in_flight(self) -> float:
        """Bytes one rank's handle keeps in flight on average."""
        full = float(self.queue_depth * self.block_size * self.intra_op_parallelism)
        return full if self.overlap_events else full / 2
