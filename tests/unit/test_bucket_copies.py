"""DeepSpeed's memory passes around each gradient bucket (stage_1_and_2.py, stage3.py as of
v0.19): their bytes follow the buckets' collectives, they run on the stream DeepSpeed runs
them on (inline on a CPU process), and the compute stream's wait for them is exposed
gradient reduction, not compute."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.core.enums import Coll
from sim.engines.plan import plan
from sim.engines.schedule import Collective, Compute, Stream
from sim.simulate import simulate
from tests.crosscheck.scenarios import tiny, without_host


def synchronous(s):
    host = replace(s.cluster.node.host, synchronous=True)
    return replace(s, cluster=replace(s.cluster, node=replace(s.cluster.node, host=host)))


def named(ops, prefix):
    return [op for op in ops if isinstance(op, Compute) and op.name.startswith(prefix)]


def grad_buckets(ops):
    return [op for op in ops if isinstance(op, Collective) and op.purpose == "grad bucket"]


@pytest.mark.parametrize("strategy", ["ds-zero1", "ds-zero2", "ds-zero2-overlap"])
def test_zero12_copies_every_reduced_bucket_into_and_out_of_the_ipg_bucket(strategy):
    s = tiny(strategy)
    ops = list(plan(s).ops(0))
    buckets = grad_buckets(ops)
    staged = named(ops, "copy gradients into the IPG bucket")
    # a gradient larger than the bucket is reduced in place (2 B per element in bf16)
    fits = [op for op in buckets if op.nbytes / 2 <= s.zero.reduce_bucket_size]
    assert fits and len(staged) == len(fits)
    # one read and one write of each bucket for the IPG copy
    assert sum(k.bytes for op in staged for k in op.kernels) == pytest.approx(2.0 * sum(op.nbytes for op in fits))
    passes = named(ops, "average and flatten the bucket")
    assert sum(k.bytes for op in passes for k in op.kernels) == pytest.approx(
        4.0 * sum(op.nbytes for op in buckets))   # div_ and the flatten
    side = Stream.REDUCE if strategy.endswith("overlap") else Stream.COMPUTE
    assert {op.stream for op in passes} == {side}
    assert all(op.stream is Stream.COMPUTE for op in staged)


def test_zero12_bucket_copies_run_inline_on_a_cpu_process():
    ops = list(plan(synchronous(tiny("ds-zero2-overlap"))).ops(0))
    copies = named(ops, "average and flatten the bucket") + named(ops, "copy this rank's reduced slices")
    assert copies and all(op.stream is Stream.COMPUTE for op in copies)


def test_stage0_and_bf16_optimizer_do_not_take_the_zero12_bucket_path():
    ops = list(plan(tiny("ds-zero0")).ops(0))
    assert grad_buckets(ops) and not named(ops, "copy gradients into the IPG bucket")


def test_zero3_stages_each_bucket_on_the_reduce_stream_and_copies_the_partition_out():
    s = tiny("ds-zero3")
    ops = list(plan(s).ops(0))
    rs = [op for op in grad_buckets(ops) if op.coll is Coll.REDUCE_SCATTER]
    staged = named(ops, "stage the gradient bucket")
    out = named(ops, "partition_grads")
    assert rs and len(staged) == len(rs) == len(out)
    assert {op.stream for op in staged + out} == {Stream.REDUCE}
    for stage, bucket in zip(staged, rs, strict=True):   # IPG copy, cat, div_: 2 bytes each per byte reduced
        assert sum(k.bytes for k in stage.kernels) <= 6.0 * bucket.nbytes * (1 + 1e-9)
        assert sum(k.bytes for k in stage.kernels) >= 4.0 * bucket.nbytes * (1 - 1e-9)
    dp = s.parallel.dp
    first = [op for op in out if op.micro_step == 0]
    later = [op for op in out if op.micro_step > 0]
    assert first and later
    assert sum(k.bytes for op in first for k in op.kernels) == pytest.approx(
        2.0 * sum(op.nbytes for op in rs if op.micro_step == 0) / dp)
    assert sum(k.bytes for op in later for k in op.kernels) == pytest.approx(
        3.0 * sum(op.nbytes for op in rs if op.micro_step > 0) / dp)   # an add: two reads, one write


def test_zero3_bucket_copies_run_inline_on_a_cpu_process():
    ops = list(plan(synchronous(tiny("ds-zero3"))).ops(0))
    copies = named(ops, "stage the gradient bucket") + named(ops, "partition_grads")
    assert copies and all(op.stream is Stream.COMPUTE for op in copies)


def test_waiting_for_the_reduce_streams_copies_is_exposed_reduction_not_compute():
    """Starved of bandwidth, ZeRO-3's reduce stream runs far behind: the wait for its copies
    is gradient reduction, and compute stays what the compute stream itself ran."""
    fast = simulate(without_host(tiny("ds-zero3-prefetch", nodes=2)))
    slow = simulate(without_host(tiny("ds-zero3-prefetch", nodes=2, comm={"busbw_GBps": {"dp": 0.05}})))
    assert slow.breakdown.compute_s == pytest.approx(fast.breakdown.compute_s, rel=0.02)
    assert slow.breakdown.exposed_by_class["gradient reductions"] > 0
    total = slow.breakdown
    assert total.total == pytest.approx(slow.step_time_s, rel=1e-9)
