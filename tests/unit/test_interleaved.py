"""Megatron's interleaved 1F1B (`[parallel] virtual_stages`): the bubble of uniform stages
without communication is (p - 1) / (m + p - 1) of the step, and v model chunks per stage
divide it by v; every (micro-batch, chunk) pass runs once each way, after its neighbours."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from sim.core.errors import InputError
from sim.des.engine import Mode
from sim.engines.policies import Interleaved, OneFOneB, Part
from sim.engines.schedule import Compute, Phase, Send
from sim.inputs.load import scenario_from_table
from sim.results.memory_report import scenario_report
from sim.simulate import simulate

# wide blocks and a vocabulary of 8: the head and embedding cost next to nothing, so the
# four stages are uniform; pipeline sends made instant
UNIFORM = {"name": "uniform", "layers": 16, "hidden": 4096, "heads": 32, "kv_heads": 32, "ffn_hidden": 16384,
           "vocab": 8}
P, M = 4, 8


def scenario(v: int, **extra):
    """The stages stay uniform only if the embedding's and the head's few small kernels cost
    nothing: the fitted per-kernel gap (`kernel_overhead_us`) is set to zero. The formula is for
    a pipeline without communication, so besides instant sends the slowdown a send inflicts on
    the compute beside it (`comm_interference`, shared SMs and HBM) is set to zero too."""
    table = {"model": UNIFORM, "cluster": "dgx-a100-80g", "nodes": 1, "gpus_per_node": P, "engine": "megatron",
             "parallel": {"tp": 1, "pp": P, "virtual_stages": v}, "comm": {"busbw_GBps": {"pp": 1e6}},
             "training": {"seq_len": 2048, "micro_batch": 1, "global_batch": M, "precision": "bf16"}, **extra}
    s = scenario_from_table(table, Path("s.toml"), "s")
    c = s.cluster
    return replace(s, cluster=replace(c, node=replace(c.node, gpu=replace(c.node.gpu, kernel_overhead=0.0, comm_interference=0.0))))


def stage0_bubble(result) -> float:
    """1 - busy / span of the first stage's forward and backward compute."""
    spans = [sp for sp in result.engine.spans if sp.rank == 0 and isinstance(sp.op, Compute)
             and sp.op.phase in (Phase.FWD, Phase.BWD)]
    span = max(sp.end for sp in spans) - min(sp.start for sp in spans)
    return 1 - sum(sp.end - sp.start for sp in spans) / span


@pytest.mark.parametrize("v", [1, 2, 4])
def test_the_bubble_is_p_minus_1_over_m_plus_p_minus_1_and_v_chunks_divide_it(v):
    r = simulate(scenario(v), mode=Mode.FULL)
    bubble = (P - 1) / v
    assert stage0_bubble(r) == pytest.approx(bubble / (M + bubble), abs=0.003)


def test_the_attributed_bubble_shrinks_by_v_and_the_step_adds_up():
    results = {v: simulate(scenario(v)) for v in (1, 2, 4)}
    for v, r in results.items():
        t = r.to_json()["time"]
        assert sum(t.values()) == pytest.approx(r.step_time_s, rel=1e-9)
        assert t["bubble_s"] == pytest.approx(results[1].to_json()["time"]["bubble_s"] / v, rel=0.03)


def test_every_pass_runs_once_each_way_and_warm_up_follows_megatron():
    for stage in range(P):
        order = Interleaved(2).order(M, P, stage)
        forward = [(ms, c) for ms, part, c in order if part is Part.FORWARD]
        backward = [(ms, c) for ms, part, c in order if part is Part.BACKWARD]
        assert sorted(forward) == sorted(backward) == sorted((ms, c) for ms in range(M) for c in range(2))
        at = {(part, ms, c): i for i, (ms, part, c) in enumerate(order)}
        assert all(at[(Part.FORWARD, *x)] < at[(Part.BACKWARD, *x)] for x in forward)
        warmup = next(i for i, (_, part, _) in enumerate(order) if part is Part.BACKWARD) - 1
        assert warmup == 2 * (P - stage - 1) + (2 - 1) * P        # schedules.py num_warmup_microbatches
    assert [(ms, c) for ms, _, c in OneFOneB().order(M, P, 0)][:3] == [(0, 0), (1, 0), (2, 0)]


def test_chunks_send_round_the_pipeline_and_hold_more_activations():
    flat, two = simulate(scenario(1)), simulate(scenario(2))
    sends = [op for op in two.schedule.ops(0) if isinstance(op, Send)]
    assert {op.name for op in sends} == {"send activations to stage 1", "send gradients to stage 3"}
    assert len(sends) == M * (2 + 1)        # stage 0: both chunks forward, the second chunk back
    peak = lambda r: r.peak_pool().peak_breakdown.get("activations", 0.0)  # noqa: E731
    assert peak(two) > peak(flat)           # 2 (p-1) + p + 1 = 11 chunk passes of 2 blocks vs 4 of 4
    for r in (flat, two):
        report = scenario_report(r.scenario)
        assert report.rows[report.this_stage].activations_bytes >= peak(r)


@pytest.mark.parametrize("change, words", [
    ({"engine": "deepspeed", "zero": {"stage": 1}}, "not simulated yet"),
    ({"training": {"seq_len": 2048, "micro_batch": 1, "global_batch": 6, "precision": "bf16"}}, "multiple of pp"),
])
def test_what_megatron_would_refuse_is_refused(change, words):
    with pytest.raises(InputError, match=words):
        scenario(2, **change)
    with pytest.raises(InputError, match="does not divide"):
        scenario(3)
    with pytest.raises(InputError, match="need a pipeline"):
        scenario_from_table({"model": UNIFORM, "cluster": "dgx-a100-80g", "nodes": 1, "engine": "megatron",
                             "parallel": {"virtual_stages": 2}, "training": {"seq_len": 512, "micro_batch": 1,
                                                                             "global_batch": 8, "precision": "bf16"}},
                            Path("s.toml"), "s")
