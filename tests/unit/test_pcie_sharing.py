"""A GPU's NIC traffic and its offload copies cross the same PCIe x16 link
(sim.analytic.opcost.ring_links, copy_links): alone each keeps its rate, together they
share the link."""

from __future__ import annotations

from pathlib import Path

import pytest
import simpy

from sim.analytic import opcost
from sim.core.enums import Axis, Coll
from sim.des.network import FlowNetwork
from sim.des.transfers import collective_transfers, copy_transfers
from sim.engines.plan import layout_of
from sim.engines.schedule import Collective, Copy, Phase, Stream
from sim.inputs.load import scenario_from_table
from tests.crosscheck.scenarios import TINY_MODEL


def scenario(nodes: int, offload: bool):
    zero = {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 2e6}
    if offload:
        zero["offload_optimizer"] = "cpu"
    return scenario_from_table({"model": TINY_MODEL, "cluster": "dgx-a100-80g", "nodes": nodes, "zero": zero,
                                "training": {"seq_len": 512, "micro_batch": 2, "grad_accum": 1,
                                             "precision": "bf16"}}, Path("s.toml"), "s")


def test_inter_node_rings_cross_the_gpus_pcie_link_both_ways_and_intra_node_ones_do_not():
    c = scenario(2, offload=False).cluster
    one_per_node = opcost.ring_links(opcost.GroupShape(2, 2, 1), c)
    eight_per_node = opcost.ring_links(opcost.GroupShape(16, 2, 8), c)
    assert dict(one_per_node) == {opcost.LinkClass.NIC: 1.0, opcost.LinkClass.PCIE_UP: 1.0,
                                  opcost.LinkClass.PCIE_DOWN: 1.0}
    assert dict(eight_per_node)[opcost.LinkClass.PCIE_UP] == 8.0
    # beyond two nodes the fabric slows the NIC ports only, not the GPU's PCIe link
    four_nodes = dict(opcost.ring_links(opcost.GroupShape(4, 4, 1), c))
    assert four_nodes[opcost.LinkClass.NIC] == pytest.approx(c.fabric_share(4)) and c.fabric_share(4) < 1.0
    assert four_nodes[opcost.LinkClass.PCIE_UP] == four_nodes[opcost.LinkClass.PCIE_DOWN] == 1.0
    assert dict(opcost.ring_links(opcost.GroupShape(8, 1, 8), c)) == {opcost.LinkClass.NVLINK: 1.0}
    assert opcost.copy_links("d2h") == (opcost.LinkClass.PCIE_UP,)
    assert opcost.copy_links("h2d") == (opcost.LinkClass.PCIE_DOWN,)


def test_alone_the_pcie_link_changes_no_collective_time():
    s = scenario(2, offload=False)
    c = s.cluster
    assert opcost.link_capacity(opcost.LinkClass.PCIE_UP, c) > opcost.link_capacity(opcost.LinkClass.NIC, c)
    phases = opcost.collective_phases(Coll.ALL_REDUCE, 1e9, opcost.GroupShape(16, 2, 8), c)
    rate = opcost.links_rate(phases[-1].links, c)
    assert rate == pytest.approx(8 * c.nic_bandwidth_per_gpu)


def test_a_d2h_copy_beside_an_inter_node_collective_slows_it_on_the_shared_link():
    s = scenario(2, offload=True)
    layout = layout_of(s)
    coll = Collective(id=1, stream=Stream.REDUCE, name="ar", phase=Phase.BWD, micro_step=0, coll=Coll.ALL_REDUCE,
                      nbytes=2e9, axis=Axis.DP)
    copy = Copy(id=2, stream=Stream.D2H, name="grads", phase=Phase.BWD, micro_step=0, nbytes=2e9,
                direction=Stream.D2H)
    (ring,) = [t for t in collective_transfers(coll, 0, (0,), layout, s) if t.nbytes > 0][-1:]
    (d2h,) = copy_transfers(copy, 0, s)
    capacity = {(0, lc): opcost.link_capacity(lc, s.cluster) for lc in opcost.LinkClass}
    capacity[(0, Stream.D2H)] = capacity[(0, Stream.H2D)] = opcost.pcie_bandwidth(s.cluster)

    def finish_times(*transfers):
        env = simpy.Environment()
        net = FlowNetwork(env, dict(capacity))
        done = [net.transfer(t.nbytes, t.links) for t in transfers]
        ends = {}
        for i, ev in enumerate(done):
            ev.callbacks.append(lambda _e, i=i: ends.__setitem__(i, env.now))
        env.run()
        return [ends[i] for i in range(len(transfers))]

    (ring_alone,), (copy_alone,) = finish_times(ring), finish_times(d2h)
    ring_shared, copy_shared = finish_times(ring, d2h)
    assert ring_shared > 1.05 * ring_alone and copy_shared >= copy_alone
    # the shared link moves no more than its capacity: both flows' bytes over the overlap
    pcie = capacity[(0, opcost.LinkClass.PCIE_UP)] * 8      # the ring's multiplier: 8 members per node
    assert ring.nbytes / ring_shared <= pcie

