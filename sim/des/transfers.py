"""What an op that uses shared links moves, over which links, and how long it takes when
it has those links to itself.

The engine runs every pipeline send, PCIe copy and collective as a list of `Transfer`s:
a latency, then bytes as one flow over links (sim.des.network). The phases come from
sim.analytic.opcost (`collective_phases`, `ring_links`), so the DES and the analytic twin
read the same cost model.

In representative mode a rank's links carry only that rank's own flows. When every op
that uses a link sits on one stream (CUDA runs a stream's ops one after another), no two
flows ever share that link, and an op whose links are all of that kind takes exactly the
closed form sum(latency + bytes / rate) (`exclusive_times`). The engine then runs it like
a compute op, with no flow and no network re-timing: Megatron's tensor-parallel
all-reduces on the compute stream are the common case. Pipeline sends stay in the
network: their arrival is what the next stage waits for.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from sim.analytic import opcost
from sim.engines.layout import Layout
from sim.engines.schedule import AnyOp, Collective, Copy, Send, Stream
from sim.inputs.scenario import Scenario

LinkId = Hashable
LINK_OPS = frozenset({Collective, Copy, Send})


@dataclass(frozen=True, slots=True)
class Transfer:
    """A latency, then `nbytes` as one flow over `links` ((link, multiplier) pairs), at a
    `rate` fixed by a measured or overridden bus bandwidth, or else at the links' share."""

    latency: float
    nbytes: float
    links: tuple[tuple[LinkId, float], ...]
    rate: float | None = None


def send_transfers(op: Send, rank: int, layout: Layout, s: Scenario) -> list[Transfer]:
    """A pipeline send: a two-member ring between this stage and the neighbouring one,
    over the sender's ports (the bus-bandwidth override of the pipeline axis, if any)."""
    c = layout.coords(rank)
    receiver = layout.rank(type(c)(c.dp, (c.pp + op.peer) % layout.pp, c.tp))
    nodes, per_node = layout.span((rank, receiver))
    phases = opcost.collective_phases(op.coll, op.nbytes, opcost.GroupShape(2, nodes, per_node), s.cluster)
    override = s.comm.override(op.axis)
    return [Transfer(ph.latency, ph.bus_bytes, tuple(((rank, link), m) for link, m in ph.links), override)
            for ph in phases]


def copy_transfers(op: Copy, rank: int, s: Scenario) -> list[Transfer]:
    """A PCIe copy: the PCIe latency, then the bytes over this rank's share of its switch's
    uplink in its direction and over the GPU's own PCIe link (which its NIC traffic crosses
    too: sim.analytic.opcost.ring_links)."""
    if op.direction in (Stream.NVME_READ, Stream.NVME_WRITE):   # one device: reads and writes share it
        n = s.gpus_per_node
        share = opcost.nvme_bandwidth(s.cluster, n, write=op.direction is Stream.NVME_WRITE) \
            / opcost.nvme_bandwidth(s.cluster, n, write=False)
        return [Transfer(s.cluster.host.pcie.latency, op.nbytes, (((rank, Stream.NVME_READ), share),))]
    share = opcost.copy_share(op.pageable, s.cluster, op.fresh)
    own = tuple(((rank, link), share) for link in opcost.copy_links(op.direction.value))
    return [Transfer(s.cluster.host.pcie.latency, op.nbytes, (((rank, op.direction), share), *own))]


def collective_transfers(op: Collective, rank: int, simulated: Iterable[int], layout: Layout,
                         s: Scenario) -> list[Transfer]:
    """The phases of `rank`'s group collective, as flows over the ports of the `simulated`
    members (the representative alone, or every member in full mode)."""
    nodes, per_node = layout.group_span(op.axis, rank)
    shape = opcost.GroupShape(len(layout.group(op.axis, rank)), nodes, per_node)
    override = s.comm.override(op.axis)
    members = tuple(simulated)
    return [Transfer(ph.latency, ph.bus_bytes, tuple(((r, link), m) for r in members for link, m in ph.links),
                     override or ph.rate)
            for ph in opcost.collective_phases(op.coll, op.nbytes, shape, s.cluster, s.comm.algorithm)]


def transfers_of(op: AnyOp, rank: int, layout: Layout, s: Scenario) -> list[Transfer] | None:
    """The representative rank's transfers of `op` (None for an op that uses no link)."""
    if isinstance(op, Send):
        return send_transfers(op, rank, layout, s)
    if isinstance(op, Copy):
        return copy_transfers(op, rank, s)
    if isinstance(op, Collective):
        return collective_transfers(op, rank, (rank,), layout, s)
    return None


def alone_time(transfers: list[Transfer], capacity: dict[LinkId, float]) -> float:
    """The closed form of transfers with their links to themselves (sim.des.network with
    one flow per link: rate = the fixed rate, else min over links of capacity x multiplier)."""
    total = 0.0
    for t in transfers:
        total += t.latency
        if t.nbytes > 0:
            total += t.nbytes / (t.rate or min(capacity[link] * m for link, m in t.links))
    return total


def _shape_key(op: Collective | Copy | Send) -> tuple[object, ...]:
    """What a representative rank's transfers of `op` depend on (identical collectives of
    identical blocks share them)."""
    if isinstance(op, Send):
        return (Send, op.nbytes, op.peer)
    if isinstance(op, Copy):
        return (Copy, op.nbytes, op.direction, op.pageable, op.fresh)
    return (Collective, op.coll, op.axis, op.nbytes)


def exclusive_times(ops: Iterable[AnyOp], rank: int, layout: Layout, s: Scenario,
                    capacity: dict[LinkId, float]) -> dict[int, float]:
    """op id -> closed-form time, for the representative rank's collectives and copies whose
    every link is used by ops of their own stream only (so their flows are always alone).
    Sends are left to the network (their arrival is signalled to the receiving stage)."""
    shapes: dict[tuple[object, ...], tuple[list[Transfer], frozenset[LinkId]]] = {}
    users: dict[LinkId, set[object]] = {}
    candidates: dict[tuple[object, ...], dict[object, list[int]]] = {}   # shape -> stream -> op ids
    for op in ops:
        if type(op) not in LINK_OPS:
            continue
        assert isinstance(op, Collective | Copy | Send)
        key = _shape_key(op)
        if key not in shapes:
            transfers = transfers_of(op, rank, layout, s)
            assert transfers is not None
            shapes[key] = (transfers, frozenset(link for t in transfers for link, _ in t.links))
        by_stream = candidates.setdefault(key, {})
        ids = by_stream.get(op.stream)
        if ids is None:
            ids = by_stream[op.stream] = []
            for link in shapes[key][1]:
                users.setdefault(link, set()).add(op.stream)
        if not isinstance(op, Send):
            ids.append(op.id)
    out: dict[int, float] = {}
    for key, by_stream in candidates.items():
        transfers, links = shapes[key]
        for stream, ids in by_stream.items():
            if ids and all(users[link] == {stream} for link in links):
                seconds = alone_time(transfers, capacity)
                out.update(dict.fromkeys(ids, seconds))
    return out
