"""The host side a node's ranks share in the DES: each PCIe switch's uplink to the CPU (per
direction), the node's NVMe (reads and writes share it: sim.des.transfers) and the node's
CPU for CPU-Adam and host casts (capacity in seconds of the whole node's CPU per second).

Full mode simulates every rank, so the ranks of a node (of a switch) share one resource and
a rank that steps alone gets all of it; representative mode simulates one rank of
identical ones that step together, each at its static share (sim.analytic.opcost)."""

from __future__ import annotations

from typing import Any

from sim.analytic import opcost
from sim.engines.layout import Layout
from sim.engines.schedule import Stream
from sim.inputs.scenario import Scenario


def host_key(rank: int, kind: Stream, *, full: bool, s: Scenario, layout: Layout) -> Any:
    """The flow-network key of a host-side resource of `rank`: its own in representative
    mode; its switch's or node's in full mode."""
    if not full:
        return (rank, kind)
    node, local = layout.node(rank), rank % s.gpus_per_node
    if kind in (Stream.H2D, Stream.D2H):
        return ("pcie switch", node, local // s.cluster.host.gpus_per_pcie_switch, kind)
    return ("node", node, kind)


def host_links(rank: int, *, full: bool, s: Scenario, layout: Layout) -> dict[Any, float]:
    """Capacities of the host-side resources `rank` uses (the module docstring)."""
    c, n = s.cluster, s.gpus_per_node
    nvme = opcost.nvme_bandwidth(c, n, write=False, aio=s.zero.aio if s.zero else None)
    if full:
        uplink, nvme, cpu = c.host.pcie.achievable_bandwidth, nvme * n, 1.0
    else:
        uplink, cpu = opcost.pcie_bandwidth(c), 1.0 / n
    key = lambda kind: host_key(rank, kind, full=full, s=s, layout=layout)  # noqa: E731
    return {key(Stream.H2D): uplink, key(Stream.D2H): uplink, key(Stream.NVME_READ): nvme, key(Stream.CPU): cpu}


def shared_links(links: tuple[tuple[Any, float], ...], *, full: bool, s: Scenario,
                 layout: Layout) -> tuple[tuple[Any, float], ...]:
    """`links` with each host-side (rank, stream) key replaced by its shared key."""
    if not full:
        return links
    return tuple(((host_key(*key, full=full, s=s, layout=layout), m) if isinstance(key[1], Stream) else (key, m))
                 for key, m in links)
