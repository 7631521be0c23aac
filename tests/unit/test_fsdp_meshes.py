"""FSDP2 on 2D data-parallel meshes: HSDP (`[fsdp] replicate_degree`) shards over dp / r
ranks and all-reduces each reduced shard over the r replicas; an int reshard_after_forward k
keeps 1/k of each block between forward and backward and gathers it back inside k ranks.
(Recorded against real gloo runs in tests/validation/test_recorded_vs_planned.py.)"""

from __future__ import annotations

import pytest

from sim.engines.schedule import Mem
from sim.simulate import simulate
from tests.crosscheck.scenarios import tiny


def run(**fsdp):
    return simulate(tiny("fsdp2", nodes=2, strategy_table={"fsdp": fsdp}))


def groups(r) -> dict[tuple[str, str], dict]:
    return {(row["op"], row["group"]): row for row in r.comm_table()}


def test_hsdp_shards_over_a_node_and_all_reduces_the_shards_across_nodes():
    plain, hsdp = run(), run(replicate_degree=2)             # 16 ranks: 2 replicas x 8 shards
    g = groups(hsdp)
    assert g[("all_gather", "dp_shard")]["group_size"] == g[("reduce_scatter", "dp_shard")]["group_size"] == 8
    assert g[("all_reduce", "dp_replicate")]["group_size"] == 2
    rs, ar = g[("reduce_scatter", "dp_shard")], g[("all_reduce", "dp_replicate")]
    assert ar["message_bytes"] == pytest.approx(rs["message_bytes"] / 8)      # each rank's shard of it
    assert ar["count"] == rs["count"]
    states = lambda r: sum(r.peak_pool().peak_breakdown.get(m, 0.0) for m in (Mem.OPTIMIZER,))  # noqa: E731
    assert states(hsdp) == pytest.approx(2 * states(plain), rel=0.02)        # shards of 1/8 instead of 1/16


def test_an_int_reshard_keeps_1_over_k_and_gathers_inside_k_ranks():
    full, two, kept = run(), run(reshard_after_forward=2), run(reshard_after_forward=False)
    g = groups(two)
    assert g[("all_gather", "dp_post")]["group_size"] == 2
    assert g[("all_gather", "dp")]["count"] == groups(kept)[("all_gather", "dp")]["count"]   # plain FSDP: dp
    params = lambda r: r.peak_pool().peak_breakdown.get(Mem.PARAMS, 0.0)  # noqa: E731
    assert params(full) < params(two) < params(kept)
