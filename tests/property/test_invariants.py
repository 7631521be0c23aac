"""Invariants of the analytic twin, checked on many random inputs (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.analytic import comm
from sim.analytic.activations import layer_activation_bytes
from sim.analytic.memory import largest_trainable_params, model_state_bytes
from sim.core.enums import Convention, Recompute, ZeroStage
from tests.conftest import catalog_model

params = st.floats(1e6, 1e13)
dps = st.integers(1, 4096)
conventions = st.sampled_from(list(Convention))
sizes = st.floats(1.0, 1e11)
bandwidths = st.floats(1e8, 1e13)
latencies = st.floats(0.0, 1e-4)
ranks = st.integers(2, 1024)
TIMES = [comm.ring_all_reduce_time, comm.ring_all_gather_time, comm.ring_reduce_scatter_time,
         comm.tree_all_reduce_time, comm.broadcast_time, comm.all_to_all_time]


@given(n=params, dp=dps, convention=conventions, offload=st.booleans())
def test_each_higher_stage_never_needs_more_model_state_memory(n, dp, convention, offload):
    sizes_ = [model_state_bytes(n, dp, s, convention, offload_optimizer=offload and s > 0).total
              for s in ZeroStage]
    assert all(a >= b * (1 - 1e-12) for a, b in zip(sizes_, sizes_[1:]))


@given(n=params, dp=st.integers(2, 4096), largest=st.floats(0, 1e10))
def test_deepspeed_stage3_exceeds_stage2_only_by_its_largest_layer_buffer(n, dp, largest):
    # The one exception to the ordering above: DeepSpeed's 4 x largest-layer term at stage 3.
    two = model_state_bytes(n, dp, ZeroStage.GRADIENTS, Convention.ALLOCATED).total
    three = model_state_bytes(n, dp, ZeroStage.PARAMETERS, Convention.ALLOCATED,
                              largest_module_params=largest).total
    assert three - two == pytest.approx(4 * largest - 2 * n * (1 - 1 / dp), rel=1e-9, abs=1e-3)


@given(n=params, dp=dps, factor=st.integers(2, 64),
       convention=st.sampled_from([Convention.PAPER, Convention.LECTURE, Convention.DEEPSPEED,
                                   Convention.ALLOCATED]))
def test_zero3_memory_falls_as_one_over_nd(n, dp, factor, convention):
    small = model_state_bytes(n, dp, ZeroStage.PARAMETERS, convention).total
    large = model_state_bytes(n, dp * factor, ZeroStage.PARAMETERS, convention).total
    assert large * factor == pytest.approx(small, rel=1e-9)


@given(mem=st.floats(1e9, 1e12), dp=dps, stage=st.sampled_from(list(ZeroStage)))
def test_largest_model_never_shrinks_with_more_gpus(mem, dp, stage):
    assert largest_trainable_params(mem, dp + 1, stage) >= largest_trainable_params(mem, dp, stage)


@given(s=sizes, grow=st.floats(1.001, 1e3), n=ranks, bw=bandwidths, lat=latencies)
def test_collective_times_grow_with_size(s, grow, n, bw, lat):
    for fn in TIMES:
        assert fn(s * grow, n, bw, lat) > fn(s, n, bw, lat)


@given(s=sizes, n=ranks, bw=bandwidths, faster=st.floats(1.001, 1e3), lat=latencies)
def test_collective_times_fall_with_bandwidth(s, n, bw, faster, lat):
    for fn in TIMES:
        assert fn(s, n, bw * faster, lat) < fn(s, n, bw, lat)


@given(s=sizes, p=st.integers(2, 16), nodes=st.integers(2, 128), bw=bandwidths, faster=st.floats(1.001, 100))
def test_hierarchical_all_reduce_grows_with_size_and_falls_with_bandwidth(s, p, nodes, bw, faster):
    def t(size, intra, inter):
        return comm.hierarchical_all_reduce_time(size, p, nodes, intra_bandwidth=intra, intra_latency=1e-6,
                                                 inter_bandwidth=inter, inter_latency=5e-6)
    assert t(2 * s, bw, bw / 8) > t(s, bw, bw / 8)
    assert t(s, bw * faster, bw * faster / 8) < t(s, bw, bw / 8)


@given(name=st.sampled_from(["gpt2-xl", "llama2-7b", "llama3-8b", "mixtral-8x7b"]),
       s=st.integers(128, 8192), b=st.integers(1, 16), tp=st.sampled_from([1, 2, 4, 8]))
def test_recompute_and_sequence_parallel_never_add_activation_memory(name, s, b, tp):
    m = catalog_model(name)
    none, selective, full = (layer_activation_bytes(m, s, b, tp=tp, recompute=r)
                             for r in (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL))
    assert none >= selective >= full
    if m.experts == 1:    # torchtitan's per-op policy: between full recomputation and none (with flash too)
        flash = layer_activation_bytes(m, s, b, tp=tp, flash=True)
        assert none >= flash >= layer_activation_bytes(m, s, b, tp=tp, recompute=Recompute.SELECTIVE_OP) >= full
    if tp > 1:
        assert layer_activation_bytes(m, s, b, tp=tp, sequence_parallel=True) <= none
