"""DeepSpeed's memory passes around each gradient bucket (stage_1_and_2.py, stage3.py as of
v0.19): their bytes follow the buckets' collectives, they run on the stream DeepSpeed runs
them on (inline on a CPU process), and the compute stream's wait for them is exposed
gradient reduction, not compute."""

from __future__ import annotations

import pytest

from sim.core.enums import Coll
from sim.engines.plan import plan
from sim.engines.schedule import Collective, Compute, Stream
from sim.simulate import simulate
from tests.crosscheck.scenarios import tiny, with_host, without_host


def named(ops, prefix):
    return [op for op in ops if isinstance(op, Compute) and op.name.startswith(prefix)]


def grad_buckets(ops):
    return [op for op in ops if isinstance(op, Collective) and op.purpose == "grad bucket"]


def kernel_bytes(ops, word):
    return sum(k.bytes for op in ops for k in op.kernels if word in k.name)


@pytest.mark.parametrize("strategy", ["ds-zero1", "ds-zero2", "ds-zero2-overlap"])
def test_zero12_copies_every_reduced_bucket_into_and_out_of_the_ipg_bucket(strategy):
    s = tiny(strategy)
    ops = list(plan(s).ops(0))
    buckets = grad_buckets(ops)
    staged = named(ops, "copy gradients into the IPG bucket")
    # a gradient larger than the bucket is reduced in place (2 B per element in bf16)
    fits = [op for op in buckets if op.nbytes / 2 <= s.zero.reduce_bucket_size]
    assert fits and len(staged) == len(fits)
    # one read and one write of each bucket for the IPG copy, and for average_tensor's div_
    assert sum(k.bytes for op in staged for k in op.kernels) == pytest.approx(2.0 * sum(op.nbytes for op in fits))
    passes = named(ops, "average and flatten the bucket")
    assert kernel_bytes(passes, "div_") == pytest.approx(2.0 * sum(op.nbytes for op in buckets))
    side = Stream.REDUCE if strategy.endswith("overlap") else Stream.COMPUTE
    assert {op.stream for op in passes} == {side}
    assert all(op.stream is Stream.COMPUTE for op in staged)


@pytest.mark.parametrize("bucket", [2e4, 2e5, 2e6])
def test_zero12_flattens_and_copies_back_only_buckets_that_span_two_partitions(bucket):
    """average_tensor merges a bucket's slices bound for one rank; one slice is flattened to
    a view and copied onto itself, which torch skips. So at most one bucket per partition
    boundary pays the flatten and the copy back; a bucket larger than a partition does, and
    so do smaller ones that straddle a boundary (where the bucket lies in the flat buffer
    matters); every reducing micro-step alike."""
    s = tiny("ds-zero2", extra_zero={"reduce_bucket_size": bucket})
    dp, ops = s.parallel.dp, list(plan(s).ops(0))
    counts = []
    for ms in (0, 1):
        reduced = [op for op in grad_buckets(ops) if op.micro_step == ms]
        at = [op for op in ops if op.micro_step == ms]
        flattened = [op for op in named(at, "average and flatten the bucket") if kernel_bytes([op], "flatten")]
        copied_back = [op for op in named(at, "copy this rank's reduced slices") if kernel_bytes([op], "copy back")]
        assert len(flattened) == len(copied_back) <= dp - 1 < len(reduced)
        partition = sum(op.nbytes for op in reduced) / dp
        assert len(flattened) > len([op for op in reduced if op.nbytes > partition])
        assert kernel_bytes(copied_back, "copy back") == pytest.approx(kernel_bytes(flattened, "flatten") / dp)
        counts.append(len(flattened))
    assert counts[0] == counts[1]


def test_zero12_hook_copies_are_not_held_behind_the_previous_buckets_reduction():
    """The hooks copy each gradient into the bucket as it arrives; the compute stream waits
    for bucket k-1 only when bucket k is flushed (average_tensor), after those copies."""
    ops = list(plan(tiny("ds-zero2-overlap")).ops(0))
    reduce_stream = sorted(op.id for op in ops if op.stream is Stream.REDUCE)
    staged = named(ops, "copy gradients into the IPG bucket")
    held = [op for op in staged if any(i < op.id for i in reduce_stream)
            and max(i for i in reduce_stream if i < op.id) in op.deps]
    assert len(staged) > 1 and not held
    waiting = [op for op in ops if op.stream is Stream.COMPUTE and set(op.deps) & set(reduce_stream)]
    assert waiting   # the wait itself is still there, on a later compute op


def test_zero12_bucket_copies_run_inline_on_a_cpu_process():
    ops = list(plan(with_host(tiny("ds-zero2-overlap"), synchronous=True)).ops(0))
    copies = named(ops, "average and flatten the bucket") + named(ops, "copy this rank's reduced slices")
    assert copies and all(op.stream is Stream.COMPUTE for op in copies)


@pytest.mark.parametrize("strategy", ["ds-zero0", "ds-zero1-bf16-optimizer"])
def test_stage0_and_bf16_optimizer_do_not_take_the_zero12_bucket_path(strategy):
    ops = list(plan(tiny(strategy)).ops(0))
    assert grad_buckets(ops) and not named(ops, "copy gradients into the IPG bucket")


def test_zero2_copies_its_partition_out_of_the_bucket_at_two_bytes_on_every_micro_step():
    """copy_grads_in_partition is a `copy_` on every micro-step (the accumulation's add is
    autograd's, into param.grad); without reduce_scatter the bucket is post-scaled by 1/dp
    after its all-reduce (`gradient_reduction_w_predivide`, `mul_`) and never flattened."""
    for extra, scale in (({}, 0.0), ({"reduce_scatter": False}, 2.0)):
        s = tiny("ds-zero2", extra_zero=extra)
        dp, ops = s.parallel.dp, list(plan(s).ops(0))
        for ms in (0, 1):
            reduced = sum(op.nbytes for op in grad_buckets(ops) if op.micro_step == ms)
            out = [op for op in named(ops, "copy this rank's reduced slices") if op.micro_step == ms]
            assert kernel_bytes(out, "copy_grads_in_partition") == pytest.approx(2.0 * reduced / dp)
            assert kernel_bytes(out, "mul_") == pytest.approx(scale * reduced)
        if extra:
            assert not named(ops, "average and flatten the bucket")


def test_zero3_stages_each_bucket_on_the_reduce_stream_and_copies_the_partition_out():
    s = tiny("ds-zero3")
    ops = list(plan(s).ops(0))
    rs = [op for op in grad_buckets(ops) if op.coll is Coll.REDUCE_SCATTER]
    staged = named(ops, "stage the gradient bucket")
    out = named(ops, "partition_grads")
    assert rs and len(staged) == len(rs) == len(out)
    assert {op.stream for op in staged + out} == {Stream.REDUCE}
    oversized = 0
    for stage, bucket in zip(staged, rs, strict=True):   # IPG copy, cat, div_: 2 bytes each per byte reduced
        assert kernel_bytes([stage], "div_") == pytest.approx(2.0 * bucket.nbytes)
        assert sum(k.bytes for k in stage.kernels) <= 6.0 * bucket.nbytes * (1 + 1e-9)
        if bucket.nbytes / 2 > s.zero.reduce_bucket_size:   # one gradient larger than the bucket: not copied
            oversized += 1
            assert kernel_bytes([stage], "IPG") == 0
        else:
            assert kernel_bytes([stage], "IPG") == pytest.approx(2.0 * bucket.nbytes, rel=1e-3)   # rel: padding
    assert oversized   # the tiny model's embedding (4.1 M elements, a 2e6 bucket)
    dp = s.parallel.dp
    first = [op for op in out if op.micro_step == 0]
    later = [op for op in out if op.micro_step > 0]
    assert first and later
    assert sum(k.bytes for op in first for k in op.kernels) == pytest.approx(
        2.0 * sum(op.nbytes for op in rs if op.micro_step == 0) / dp)
    assert sum(k.bytes for op in later for k in op.kernels) == pytest.approx(
        3.0 * sum(op.nbytes for op in rs if op.micro_step > 0) / dp)   # an add: two reads, one write


def test_zero3_qgz_keeps_the_ipg_copy_and_partition_grads():
    """qgZ replaces only the averaging scatter: the hook's IPG copy and partition_grads run
    as they do without it."""
    ops = list(plan(tiny("ds-zero3-zeropp", nodes=2)).ops(0))   # qgZ acts across nodes
    assert any(op.name.startswith("qgZ") for op in ops)
    assert named(ops, "copy gradients into the IPG bucket") and named(ops, "partition_grads")
    assert not named(ops, "stage the gradient bucket")


def test_zero3_bucket_copies_run_inline_on_a_cpu_process():
    ops = list(plan(with_host(tiny("ds-zero3"), synchronous=True)).ops(0))
    copies = named(ops, "stage the gradient bucket") + named(ops, "partition_grads")
    assert copies and all(op.stream is Stream.COMPUTE for op in copies)


def test_waiting_for_the_reduce_streams_copies_is_exposed_reduction_not_compute():
    """Starved of bandwidth, ZeRO-3's reduce stream runs far behind: the wait for its copies
    is gradient reduction, and compute stays what the compute stream itself ran."""
    fast = simulate(without_host(tiny("ds-zero3-prefetch", nodes=2)))
    slow = simulate(without_host(tiny("ds-zero3-prefetch", nodes=2, comm={"busbw_GBps": {"dp": 0.05}})))
    assert slow.breakdown.compute_s == pytest.approx(fast.breakdown.compute_s, rel=0.02)
    assert slow.breakdown.exposed_by_class["gradient reductions"] > 0
    assert slow.breakdown.exposed_by_kind["kernels on the comm (reduce) stream"] > 0
    total = slow.breakdown
    assert total.total == pytest.approx(slow.step_time_s, rel=1e-9)
