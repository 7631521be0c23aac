"""NCCL's choice of algorithm and protocol, and the latency and bandwidth it gets with them.

NCCL has no size thresholds: for each collective it predicts time = latency + bytes / bw
for every (algorithm, protocol) and runs the fastest (NVIDIA/nccl src/graph/tuning.cc
`ncclTopoGetAlgoTime`, src/enqueue.cc). We do the same with its constants:

- Protocols: LL (8-byte stores, half the bandwidth, lowest latency), LL128 (120 of 128
  bytes useful: 0.92 of the bandwidth), Simple (full bandwidth, highest latency).
- Latency, ring: base + intra-node steps x NVLink hop latency + inter-node steps x network
  hop latency (a group with one member per node pays the tree's network hop latency, its
  steps being fully exposed); a multi-node Simple ring all-reduce pays 1.4x (the "plateau
  effect", sm80+). Tree all-reduce: base + 2 ((p - 1) NVLink hops + log2(nodes) network
  hops).
- Tree bandwidth: 0.92 of the ring's on up to two nodes; per-channel caps bring it to about
  0.74 of it from four nodes on (Ampere: 17.8 of 24 GB/s per channel).

The per-hop constants are NCCL's defaults; a cluster file's `latency_us` (the Simple hop
latency, 3.4 us NVLink and 14 us network by default) scales every protocol's hop latency
on that link class in proportion, so a fitted latency moves them together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum


class Protocol(StrEnum):
    LL = "LL"
    LL128 = "LL128"
    SIMPLE = "Simple"


class Route(StrEnum):
    RING = "ring"
    TREE = "tree"


US = 1e-6
# tuning.cc baseLat and hwLat (us), by protocol (LL, LL128, Simple)
BASE = {Route.RING: (6.6, 14.0, 8.4), Route.TREE: (6.8, 14.0, 8.4)}
NVLINK_HOP = {Route.RING: (0.6, 1.9, 3.4), Route.TREE: (0.6, 1.25, 4.0)}
NET_HOP = {Route.RING: (2.7, 4.0, 14.0), Route.TREE: (5.0, 8.5, 14.0)}
DEFAULT_SIMPLE_HOP = (3.4, 14.0)          # NVLink, network: what the cluster files' latency_us scale
BANDWIDTH = {Protocol.LL: 0.5, Protocol.LL128: 0.92, Protocol.SIMPLE: 1.0}
RING_PLATEAU = 1.4                        # multi-node Simple ring all-reduce latency factor (sm80+)
TREE_BANDWIDTH = (0.92, 0.74)             # of the ring's: up to two nodes, from four nodes on
PROTOCOLS = tuple(Protocol)


@dataclass(frozen=True, slots=True)
class Choice:
    """One (route, protocol) with its latency (s) and the fraction of the links' bus
    bandwidth it reaches."""

    route: Route
    protocol: Protocol
    latency: float
    bandwidth: float


def ring_latency(steps: int, inter_steps: int, per_node: int, protocol: Protocol, all_reduce: bool,
                 hop_intra: float, hop_inter: float) -> float:
    """Seconds of latency of a ring with `steps` steps, `inter_steps` of them across nodes."""
    i = PROTOCOLS.index(protocol)
    intra = NVLINK_HOP[Route.RING][i] * hop_intra / DEFAULT_SIMPLE_HOP[0]
    net_table = NET_HOP[Route.TREE] if per_node <= 1 else NET_HOP[Route.RING]
    inter = net_table[i] * hop_inter / DEFAULT_SIMPLE_HOP[1]
    latency = BASE[Route.RING][i] + (steps - inter_steps) * intra + inter_steps * inter
    if all_reduce and inter_steps and protocol is Protocol.SIMPLE:
        latency *= RING_PLATEAU
    return latency * US


def tree_latency(per_node: int, nodes: int, protocol: Protocol, hop_intra: float, hop_inter: float) -> float:
    """Seconds of latency of NCCL's tree all-reduce (chain in the node, double binary tree
    across nodes)."""
    i = PROTOCOLS.index(protocol)
    intra = NVLINK_HOP[Route.TREE][i] * hop_intra / DEFAULT_SIMPLE_HOP[0]
    inter = NET_HOP[Route.TREE][i] * hop_inter / DEFAULT_SIMPLE_HOP[1]
    return (BASE[Route.TREE][i] + 2 * ((per_node - 1) * intra + math.log2(max(nodes, 1)) * inter)) * US


def choices(all_reduce: bool, steps: int, inter_steps: int, per_node: int, nodes: int, hop_intra: float,
            hop_inter: float, tree: bool) -> list[Choice]:
    """Every (route, protocol) NCCL would consider for this collective."""
    out = [Choice(Route.RING, p, ring_latency(steps, inter_steps, per_node, p, all_reduce, hop_intra, hop_inter),
                  BANDWIDTH[p]) for p in PROTOCOLS]
    if tree and all_reduce and nodes > 1:
        share = TREE_BANDWIDTH[0] if nodes <= 2 else TREE_BANDWIDTH[1]
        out += [Choice(Route.TREE, p, tree_latency(per_node, nodes, p, hop_intra, hop_inter), BANDWIDTH[p] * share)
                for p in PROTOCOLS]
    return out

