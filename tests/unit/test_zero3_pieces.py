"""DeepSpeed ZeRO-3's per-rank Python slicing: coalesced all-gathers are unpacked and
reduce-scatter buckets packed one (rank, tensor) piece at a time on the host."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.des.host import host_cost
from sim.engines.plan import layout_of, planner_for
from sim.engines.schedule import Collective, Compute
from sim.simulate import simulate
from tests.crosscheck.scenarios import tiny


def zero3(nodes: int):
    return tiny("ds-zero3-prefetch", nodes=nodes)


def test_every_reduce_scatter_costs_dp_pieces_per_tensor_it_reduces():
    r = simulate(zero3(2))
    dp = r.scenario.parallel.dp
    reductions = [op for op in r.schedule.ops(0) if isinstance(op, Collective) and op.purpose == "grad bucket"]
    assert reductions and all(op.pieces % dp == 0 and op.pieces > 0 for op in reductions)
    # every gradient tensor of a micro-step is reduced once, so dp pieces each, per micro-step
    per_step = sum(op.pieces for op in reductions) / (dp * r.scenario.training.grad_accum)
    planner = planner_for(r.scenario, layout_of(r.scenario))
    assert per_step == sum(len(g.tensors) for g in planner.granules if not g.shares)


def test_coalesced_gathers_are_unpacked_with_a_copy_of_what_they_gathered():
    r = simulate(zero3(1))
    unpacks = [op for op in r.schedule.ops(0) if isinstance(op, Compute) and op.name == "unpack coalesced all-gather"]
    assert unpacks and all(op.pieces > 0 and len(op.kernels) == 1 for op in unpacks)


@pytest.mark.parametrize("nodes", [1, 2])
def test_the_host_pays_the_pieces_at_the_piece_rate(nodes):
    s = zero3(nodes)
    host = s.cluster.node.host
    r = simulate(s)
    op = next(op for op in r.schedule.ops(0) if op.pieces)
    with_pieces = host_cost(op, host, s.engine)
    without = host_cost(op, replace(host, zero3_rank_piece=0.0), s.engine)
    assert with_pieces - without == pytest.approx(op.pieces * host.zero3_rank_piece)


def test_more_ranks_cost_the_host_more_slicing_per_step():
    small, large = (sum(op.pieces for op in simulate(zero3(n)).schedule.ops(0)) for n in (1, 2))
    assert large == pytest.approx(2 * small, rel=0.05)


def test_persistent_parameters_are_gathered_one_collective_each_after_the_step():
    """`_post_step` -> `_allgather_params_coalesced`: one all_gather_into_tensor per
    persistent parameter, then a device synchronize (the step's end, where every stream
    and the host meet), on GPU clusters as on the CPU one."""
    r = simulate(zero3(2))
    planner = planner_for(r.scenario, layout_of(r.scenario))
    post = [op for op in r.schedule.ops(0) if isinstance(op, Collective) and op.purpose == "post-step"]
    assert len(planner.persistent) > 1 and len(post) == len(planner.persistent)
    assert max(op.id for op in r.schedule.ops(0)) == post[-1].id     # nothing follows them in the step


def test_the_exposed_time_of_each_collective_purpose_adds_up_to_the_exposed_communication():
    """TimeBreakdown.exposed_comm_by_purpose: what `zerosim explain` takes the post-step
    gathers' exposure from (they run after the step's last compute, so some is exposed)."""
    b = simulate(zero3(2)).breakdown
    assert sum(b.exposed_comm_by_purpose.values()) == pytest.approx(b.exposed_comm_s)
    assert b.exposed_comm_by_purpose["post-step"] > 0
    assert b.exposed_comm_by_purpose["post-step"] == pytest.approx(
        sum(s for kind, s in b.exposed_by_kind.items() if kind.endswith("(post-step)")))
