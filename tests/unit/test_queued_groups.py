"""Collectives of one process group run one at a time, in issue order (ProcessGroupNCCL's
one stream per group; NCCL serializes a communicator's collectives): each waits for the
group's previous one, whatever stream it is issued on. Other groups, and gloo on a CPU
process, do not queue (sim.engines.skeleton `QUEUED_GROUPS`)."""

from __future__ import annotations

import pytest

from sim.core.enums import Axis
from sim.engines.plan import plan
from sim.engines.schedule import Collective
from sim.simulate import simulate
from tests.crosscheck.scenarios import tiny, with_host


def collectives(s) -> list[Collective]:
    ops = plan(s).classes[0].ops()
    return sorted((op for op in ops if isinstance(op, Collective)), key=lambda op: op.id)


@pytest.mark.parametrize("strategy", ["fsdp2", "ds-zero3", "ds-zero2-overlap", "megatron-distopt"])
def test_each_data_parallel_collective_waits_for_the_groups_previous_one(strategy):
    ops = collectives(tiny(strategy, nodes=2))
    on_dp = [op for op in ops if op.axis is Axis.DP]
    assert len(on_dp) > 2
    for before, op in zip(on_dp, on_dp[1:], strict=False):
        assert before.id in op.deps, (before.name, op.name)


def test_the_reduce_scatter_holds_back_the_gather_issued_after_it_on_another_stream():
    """FSDP2's backward: block i's reduce-scatter (reduce stream) is issued before block
    i - 2's all-gather (all-gather stream); the gather now waits for it."""
    ops = collectives(tiny("fsdp2", nodes=2))
    pairs = [(a, b) for a, b in zip(ops, ops[1:], strict=False)
             if a.name.startswith("reduce-scatter block") and b.name.startswith("all-gather block")]
    assert pairs
    for rs, ag in pairs:
        assert rs.stream is not ag.stream and rs.id in ag.deps


def test_other_groups_do_not_queue():
    """HSDP's replicate all-reduce waits for its own shard's reduce-scatter only, and no
    collective of the shard group waits for a replicate one."""
    ops = collectives(tiny("fsdp2-hsdp", nodes=2))
    replicate = [op for op in ops if op.axis is Axis.DP_REPLICATE]
    shard = [op for op in ops if op.axis is Axis.DP_SHARD]
    assert replicate and shard
    shard_ids, replicate_ids = {op.id for op in shard}, {op.id for op in replicate}
    assert all(len(set(op.deps) & shard_ids) <= 1 for op in replicate)   # its own reduce-scatter only
    assert not any(replicate_ids & set(op.deps) for op in shard)


def test_a_cpu_process_does_not_queue_its_gloo_collectives():
    s = with_host(tiny("ds-zero3", nodes=1), synchronous=True)
    ops = [op for op in collectives(s) if op.axis is Axis.DP]
    assert not all(a.id in b.deps for a, b in zip(ops, ops[1:], strict=False))


def test_queueing_costs_where_a_gather_would_have_shared_the_links(monkeypatch):
    """Two nodes of a tiny model: the gathers behind the reduce-scatters end later than when
    the two shared the links, so the step is longer."""
    import sim.engines.skeleton as skeleton
    s = tiny("fsdp2", nodes=2, micro_batch=8)
    queued = simulate(s).step_time_s
    monkeypatch.setattr(skeleton, "QUEUED_GROUPS", frozenset())
    shared = simulate(s).step_time_s
    assert queued > shared * 1.005
