"""Behaviour a user would check (issue: what it must show)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from sim.core.enums import Coll
from sim.engines.schedule import Collective, Kind, Stream
from sim.results.trace import chrome_trace
from sim.simulate import simulate, volume_by_kind
from sim.studies.check import op_cost
from tests.crosscheck.scenarios import tiny, without_host

BIG = {"name": "mid", "layers": 8, "hidden": 2048, "heads": 16, "kv_heads": 16, "ffn_hidden": 5504,
       "vocab": 32000}


def zero3(**kw):
    return tiny("ds-zero3-prefetch", model=BIG, nodes=2, seq_len=4096, micro_batch=4, **kw)


def test_zero3_with_ample_bandwidth_approaches_compute_time():
    # the host is its own bound (ZeRO-3's per-module hooks); this is about the device
    r = simulate(without_host(zero3(comm={"busbw_GBps": {"dp": 1e6}})))
    busy = r.breakdown.compute_s + r.breakdown.optimizer_s
    assert r.step_time_s == pytest.approx(busy, rel=0.005)


def test_zero3_with_starved_bandwidth_approaches_communication_time():
    # All-gathers and reduce-scatters share each GPU's NIC, so the link's total work bounds the step.
    # 0.25 GB/s: the compute that cannot overlap (before the first all-gather lands, after the
    # last reduce-scatter is issued) stays under 1% of the link's work with the fitted A100
    r = simulate(without_host(zero3(comm={"busbw_GBps": {"dp": 0.25}})))
    comm = sum(op_cost(op, r.scenario, r.layout) for op in r.schedule.ops(0) if op.kind is Kind.COLLECTIVE)
    assert r.step_time_s >= comm * (1 - 1e-9)
    assert r.step_time_s == pytest.approx(comm, rel=0.01)
    assert r.breakdown.exposed_comm_s > 0.9 * r.step_time_s


def exposed_all_gather(r) -> float:
    return sum(v for k, v in r.breakdown.exposed_by_kind.items() if k.startswith("all_gather"))


def fsdp2_prefetch(depth: int):
    s = tiny("fsdp2", model=BIG, nodes=2, seq_len=4096, micro_batch=4, comm={"busbw_GBps": {"dp": 20}})
    return replace(s, fsdp=replace(s.fsdp, forward_prefetch=depth, backward_prefetch=depth))


def test_deeper_fsdp2_prefetch_never_exposes_more_all_gather_and_costs_memory():
    runs = [simulate(fsdp2_prefetch(d)) for d in (0, 1, 2, 3)]
    exposed = [exposed_all_gather(r) for r in runs]
    peaks = [r.peak_pool().peak for r in runs]
    assert all(a >= b - 1e-12 for a, b in zip(exposed, exposed[1:])), exposed
    assert all(a < b for a, b in zip(peaks, peaks[1:])), peaks
    assert exposed[1] < 0.2 * exposed[0]


def zero3_prefetch(bucket: float):
    return simulate(zero3(extra_zero={"stage3_prefetch_bucket_size": bucket, "stage3_max_reuse_distance": 0},
                          comm={"busbw_GBps": {"dp": 20}}))


def test_zero3_prefetch_hides_all_gathers_and_costs_memory():
    off, on = zero3_prefetch(0), zero3_prefetch(4.2e6)   # one projection of the model
    assert exposed_all_gather(on) < 0.2 * exposed_all_gather(off)
    assert on.peak_pool().peak > off.peak_pool().peak


def test_zero3_coalesced_prefetch_makes_a_huge_bucket_expose_more():
    # DeepSpeed issues each prefetch as ONE coalesced all-gather (partitioned_param_coordinator.py):
    # the next module waits for the whole batch, so past about one module's worth a bigger bucket
    # exposes more all-gather at the start of every micro-step, not less (docs/simulator.md).
    small, huge = zero3_prefetch(4.2e6), zero3_prefetch(1e8)
    assert exposed_all_gather(huge) > exposed_all_gather(small)


def test_zero2_without_overlap_comm_is_slower_by_about_the_reduction_time():
    # compute-bound enough for overlap to matter: 16K tokens per GPU per micro-step
    on = simulate(without_host(tiny("ds-zero2-overlap", model=BIG, nodes=2, seq_len=4096, micro_batch=4)))
    off = simulate(without_host(tiny("ds-zero2", model=BIG, nodes=2, seq_len=4096, micro_batch=4)))
    # what overlap moves to the reduction stream: the bucket all-reduces and the bucket's
    # own copies around them (average_tensor's div_ and flatten, the copy back)
    reductions = sum(op_cost(op, on.scenario, on.layout) for op in on.schedule.ops(0)
                     if op.stream is Stream.REDUCE)
    exposed = on.breakdown.exposed_by_kind
    hidden_when_on = reductions - exposed.get("all_reduce (grad bucket)", 0.0) - exposed.get(
        f"kernels on the {Stream.REDUCE} stream", 0.0)
    assert off.step_time_s - on.step_time_s == pytest.approx(hidden_when_on, rel=1e-6)
    assert off.step_time_s - on.step_time_s > 0.8 * reductions


@pytest.mark.parametrize("accum", [2, 4])
def test_zero2_sends_accumulation_times_the_gradient_traffic_of_zero1(accum):
    z1 = simulate(tiny("ds-zero1", grad_accum=accum))
    z2 = simulate(tiny("ds-zero2", grad_accum=accum))
    def grads(r):
        return sum(op.nbytes for op in r.schedule.ops(0)
                   if isinstance(op, Collective) and op.coll is Coll.ALL_REDUCE and op.purpose == "grad bucket")
    assert grads(z2) == pytest.approx(accum * grads(z1))
    assert volume_by_kind(z2)["all_gather"] == volume_by_kind(z1)["all_gather"]


def test_same_scenario_twice_gives_identical_json_and_trace():
    a, b = simulate(zero3(), steps=2), simulate(zero3(), steps=2)
    assert json.dumps(a.to_json(), sort_keys=True) == json.dumps(b.to_json(), sort_keys=True)
    assert json.dumps(chrome_trace(a), sort_keys=True) == json.dumps(chrome_trace(b), sort_keys=True)


def test_offload_exposes_pcie_and_cpu_adam():
    r = simulate(tiny("ds-zero2-offload", model=BIG))
    assert r.breakdown.exposed_offload_s > 0
    kinds = {op.kind for op in r.schedule.ops(0)}
    assert Kind.CPU_OPTIMIZER in kinds and Kind.COPY in kinds
