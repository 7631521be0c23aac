"""Rings over more nodes keep less of their two-node inter-node bandwidth:
1 / (1 + (N - 2) / fabric_halving_nodes) (sim.core.specs.ClusterSpec.fabric_share,
applied to the NIC ports in sim.analytic.opcost.ring_links)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from sim.analytic import opcost
from sim.core.enums import Coll
from sim.core.errors import InputError
from sim.inputs.catalog import catalog_dir
from sim.inputs.hardware import cluster_from_table, load_cluster
from sim.inputs.reading import read_toml
from sim.simulate import simulate
from sim.studies.fit_params import parameters
from tests.crosscheck.scenarios import tiny

HARDWARE = catalog_dir("hardware")


def cluster(halving: float = 30.0):
    return replace(load_cluster(HARDWARE / "dgx-a100-80g.toml"), fabric_halving_nodes=halving)


def bandwidth_seconds(c, nodes: int, nbytes: float = 8e9) -> float:
    """The bandwidth term of an all-gather over `nodes` full nodes (latency taken out)."""
    (phase,) = opcost.collective_phases(Coll.ALL_GATHER, nbytes, opcost.GroupShape(8 * nodes, nodes, 8), c)
    return opcost.isolated_time([phase], c) - phase.latency


def test_two_nodes_keep_the_measured_rate_and_the_halving_count_halves_it():
    c = cluster(30.0)
    assert c.fabric_share(1) == c.fabric_share(2) == 1.0
    assert c.fabric_share(32) == pytest.approx(0.5)
    assert c.fabric_share(122) == pytest.approx(0.2)
    assert cluster(math.inf).fabric_share(1024) == 1.0


def test_a_ring_over_more_nodes_moves_its_bytes_slower_by_the_fabric_share():
    c, ideal = cluster(30.0), cluster(math.inf)
    for nodes in (2, 8, 32, 128):
        ratio = bandwidth_seconds(c, nodes) / bandwidth_seconds(ideal, nodes)
        assert ratio == pytest.approx(1.0 / c.fabric_share(nodes), rel=1e-9)
    assert bandwidth_seconds(c, 32) == pytest.approx(2.0 * bandwidth_seconds(ideal, 32), rel=1e-9)
    # inside a node the fabric is not crossed
    (inside,) = opcost.collective_phases(Coll.ALL_GATHER, 8e9, opcost.GroupShape(8, 1, 8), c)
    assert dict(inside.links) == {opcost.LinkClass.NVLINK: 1.0}


def test_the_catalog_files_state_a_fabric_and_a_file_without_one_keeps_the_two_node_rate():
    c = load_cluster(HARDWARE / "dgx-h100.toml")
    assert 2.0 <= c.fabric_halving_nodes <= 2000.0
    table = read_toml(HARDWARE / "dgx-h100.toml")
    del table["inter_node"]["fabric_halving_nodes"]
    bare = cluster_from_table(table, "x.toml", HARDWARE)
    assert math.isinf(bare.fabric_halving_nodes) and bare.fabric_share(512) == 1.0


def test_a_fabric_halving_count_that_is_not_positive_is_refused_with_its_key():
    table = read_toml(HARDWARE / "dgx-h100.toml")
    table["inter_node"]["fabric_halving_nodes"] = 0
    with pytest.raises(InputError, match="inter_node.fabric_halving_nodes"):
        cluster_from_table(table, "x.toml", HARDWARE)


def on_fabric(s, halving: float):
    return replace(s, cluster=replace(s.cluster, fabric_halving_nodes=halving))


def test_the_des_slows_a_data_parallel_step_over_more_than_two_nodes_and_only_there():
    two, four = tiny("ds-zero3", nodes=2), tiny("ds-zero3", nodes=4)
    assert simulate(on_fabric(two, 2.0)).step_time_s == simulate(on_fabric(two, math.inf)).step_time_s
    ideal, congested = simulate(on_fabric(four, math.inf)), simulate(on_fabric(four, 2.0))
    assert congested.step_time_s > ideal.step_time_s
    exposed = (congested.breakdown.exposed_comm_s, ideal.breakdown.exposed_comm_s)
    assert exposed[0] > exposed[1]


def test_the_fit_moves_a_clusters_fabric_only_where_a_row_spans_more_than_two_nodes():
    names = {p.name for p in parameters([tiny("ds-zero3", nodes=2)])}
    assert not any("fabric_halving_nodes" in n for n in names)
    names = {p.name for p in parameters([tiny("ds-zero3", nodes=4)])}
    assert "DGX-A100-80GB.inter_node.fabric_halving_nodes" in names
    assert not any(n.endswith("inter_node.efficiency") for n in names)
