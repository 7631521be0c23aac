"""ZeRO-Offload's step as DeepSpeed runs it (sub-groups, partial `ratio`, pinned or pageable
copies) and the ZeRO-Offload paper's delayed parameter update (sim.engines.offload)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from sim.analytic.offload import tokens_to_hide_offload
from sim.core.errors import InputError
from sim.core.specs import LinkSpec
from sim.engines.offload import cpu_share, sub_groups
from sim.engines.schedule import Copy, CpuStep, Mem, Phase, Stream
from sim.inputs.load import scenario_from_table
from sim.simulate import simulate
from tests.crosscheck.scenarios import TINY_MODEL


def table(zero: dict, nodes: int = 1, **training) -> dict:
    return {"model": TINY_MODEL, "cluster": "dgx-a100-80g", "nodes": nodes, "zero": zero,
            "training": {"seq_len": 512, "micro_batch": 2, "grad_accum": 1, "precision": "bf16", **training}}


def run(zero: dict, **training):
    return simulate(scenario_from_table(table(zero, **training), Path("s.toml"), "s"))


def spans(result, kind):
    return [sp for sp in result.engine.spans if isinstance(sp.op, kind) and sp.rank == 0]


def test_sub_groups_cut_the_partition_and_ratio_keeps_the_first_ones_on_the_gpu():
    assert sub_groups(10.0, 4) == [10 / 3] * 3 and sub_groups(3.0, 4) == [3.0] and sub_groups(5.0, 0) == [5.0]
    assert cpu_share(8.0, 2, 1.0) == 1.0
    assert cpu_share(8.0, 2, 0.5) == pytest.approx(0.5)       # 4 groups: int(0.5 x 4) = 2 on the GPU
    assert cpu_share(8.0, 2, 0.3) == pytest.approx(0.5)       # int(0.7 x 4) = 2 on the GPU (stage3.py)
    assert cpu_share(8.0, 2, 0.0) == 0.0


def test_zero3_offload_runs_sub_group_after_sub_group_with_a_cpu_cast_and_a_pageable_h2d():
    r = run({"stage": 3, "offload_optimizer": "cpu", "sub_group_size": 2_000_000})
    cpu = sorted(spans(r, CpuStep), key=lambda sp: sp.start)
    h2d = sorted([sp for sp in spans(r, Copy) if sp.op.direction is Stream.H2D and sp.op.phase is Phase.STEP],
                 key=lambda sp: sp.start)     # the step's copies (not the backward's host-buffer round trips)
    adam = [sp for sp in cpu if sp.op.params > 0]
    casts = [sp for sp in cpu if sp.op.host_bytes > 0]
    assert len(adam) == len(casts) == len(h2d) >= 2
    assert all(sp.op.pageable for sp in h2d)
    for i in range(len(adam) - 1):   # the host does one sub-group at a time: Adam, cast, copy, next
        assert adam[i].end <= casts[i].start + 1e-12 and casts[i].end <= h2d[i].start + 1e-12
        assert h2d[i].end <= adam[i + 1].start + 1e-12
    host = sum(a.nbytes for a in r.schedule.classes[0].host if a.category is Mem.OPTIMIZER)   # 16 B per parameter
    grads = sum(a.nbytes for a in r.schedule.classes[0].host if a.category is Mem.GRADS)
    assert grads == pytest.approx(2 * host / 16)      # the 16-bit gradient partition buffer
    assert sum(sp.op.params for sp in adam) == pytest.approx(host / 16)
    assert sum(sp.op.host_bytes for sp in casts) == pytest.approx(6 * host / 16)   # fp32 read, bf16 written


def test_pageable_copies_are_slower_than_pinned_ones():
    pinned = run({"stage": 2, "offload_optimizer": {"device": "cpu"}})
    pageable = run({"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": False}})
    d2h = [sp for sp in spans(pageable, Copy) if sp.op.direction is Stream.D2H]
    assert d2h and all(sp.op.pageable for sp in d2h)
    assert not any(sp.op.pageable for sp in spans(pinned, Copy))
    h2d = {name: next(sp for sp in spans(res, Copy) if sp.op.direction is Stream.H2D)
           for name, res in (("pinned", pinned), ("pageable", pageable))}
    share = pageable.scenario.cluster.host.pcie_pageable_efficiency
    latency = pageable.scenario.cluster.host.pcie.latency
    busy = {k: v.end - v.start - latency for k, v in h2d.items()}
    assert busy["pageable"] == pytest.approx(busy["pinned"] / share, rel=1e-6)
    assert pageable.step_time_s > pinned.step_time_s


def test_partial_offload_keeps_the_gpu_sub_groups_state_on_the_gpu_and_their_gradients_off_pcie():
    full = run({"stage": 3, "offload_optimizer": "cpu", "sub_group_size": 1_000_000})
    half = run({"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5}, "sub_group_size": 1_000_000})
    host = {k: sum(a.nbytes for a in r.schedule.classes[0].host if a.category is Mem.OPTIMIZER)
            for k, r in (("full", full), ("half", half))}
    groups = len([sp for sp in spans(full, CpuStep) if sp.op.params > 0])
    on_cpu = groups - int(0.5 * groups)
    assert len([sp for sp in spans(half, CpuStep) if sp.op.params > 0]) == on_cpu
    assert host["half"] == pytest.approx(host["full"] * on_cpu / groups, rel=1e-9)
    # the boundary's fp32 gradient copies (every partition makes the host-buffer round trip,
    # whatever the ratio: the buffer is on the CPU whenever the optimizer is offloaded)
    d2h = {k: sum(sp.op.nbytes for sp in spans(r, Copy) if sp.op.direction is Stream.D2H
                  and "host gradient buffer" not in sp.op.name) for k, r in (("full", full), ("half", half))}
    assert d2h["half"] == pytest.approx(d2h["full"] * on_cpu / groups, rel=1e-9)
    assert half.peak_pool().peak > full.peak_pool().peak      # the GPU sub-groups' 16 B per parameter
    assert half.step_time_s < full.step_time_s                # less CPU-Adam, run beside the GPU Adam


def test_ratio_needs_stage_3_and_the_delayed_update_needs_offload():
    with pytest.raises(InputError, match=r"zero.offload_optimizer.ratio.*needs stage 3"):
        scenario_from_table(table({"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}),
                            Path("s.toml"), "s")
    with pytest.raises(InputError, match=r"training.delayed_parameter_update.*offload_optimizer"):
        scenario_from_table(table({"stage": 2}, delayed_parameter_update=True), Path("s.toml"), "s")


def lecture_7b(tokens_per_step: int, delayed: bool):
    """Llama-2-7B on one A100 with ZeRO-2 + CPU offload at the lecture's rates (reference/000
    Sec. 4.4): CPU-Adam 1.5 G params/s, PCIe 25 GB/s."""
    t = {"model": "llama2-7b", "cluster": "dgx-a100-80g", "nodes": 1, "gpus_per_node": 1,
         "zero": {"stage": 2, "offload_optimizer": "cpu", "overlap_comm": True, "reduce_bucket_size": 50_000_000},
         "training": {"seq_len": 4096, "micro_batch": 1, "grad_accum": tokens_per_step // 4096, "precision": "bf16",
                      "recompute": "full", "delayed_parameter_update": delayed}}
    s = scenario_from_table(t, Path("s.toml"), "s")
    host = replace(s.cluster.host, cpu_adam_params_per_s=1.5e9, gpus_per_pcie_switch=1,
                   pcie=LinkSpec(bandwidth=25e9, efficiency=1.0, latency=10e-6))
    cluster = replace(s.cluster, node=replace(s.cluster.node, host=host))
    return simulate(replace(s, cluster=cluster))


def test_lecture_7b_at_8k_tokens_pcie_hides_cpu_adam_does_not_and_the_delayed_update_overlaps_them():
    r = lecture_7b(8192, delayed=False)
    compute_end = max(sp.end for sp in r.engine.spans if sp.rank == 0 and sp.op.stream is Stream.COMPUTE
                      and sp.op.phase.value == "bwd")
    d2h = [sp for sp in spans(r, Copy) if sp.op.direction is Stream.D2H]
    adam = spans(r, CpuStep)
    # PCIe: the gradient partition goes down during backward, bucket by bucket (hidden)
    assert sum(sp.end - sp.start for sp in d2h) == pytest.approx(7e9 * 2 / 25e9, rel=0.05)
    late = sum(max(0.0, sp.end - max(sp.start, compute_end)) for sp in d2h)
    assert late < 0.05 * sum(sp.end - sp.start for sp in d2h)
    # CPU-Adam: 6.7e9 parameters at 1.5 G/s, after the backward (exposed)
    assert sum(sp.end - sp.start for sp in adam) == pytest.approx(6.74e9 / 1.5e9, rel=0.02)
    assert min(sp.start for sp in adam) >= compute_end - 1e-9
    # the formula's threshold is above 8K tokens: CPU-Adam + PCIe take longer than 8K tokens of GPU work
    assert tokens_to_hide_offload(cpu_adam_params_per_s=1.5e9, pcie_bandwidth=25e9, peak_flops=312e12,
                                  mfu=0.4) > 8192
    dpu = lecture_7b(8192, delayed=True)
    gpu_path = compute_end
    cpu_path = sum(sp.end - sp.start for sp in spans(dpu, CpuStep)) + next(
        sp.end - sp.start for sp in spans(dpu, Copy) if sp.op.direction is Stream.H2D)
    assert dpu.step_time_s < r.step_time_s
    assert dpu.step_time_s == pytest.approx(max(gpu_path, cpu_path), rel=0.05)
    assert r.step_time_s == pytest.approx(gpu_path + cpu_path, rel=0.05)


@pytest.mark.parametrize("stage, offload", [
    (2, {"offload_optimizer": "cpu"}),
    (3, {"offload_optimizer": "cpu"}),
    (3, {"offload_optimizer": {"device": "cpu", "ratio": 0.5}, "sub_group_size": 1_000_000}),
    (3, {"offload_optimizer": "cpu", "offload_param": "cpu"}),
])
def test_offloading_never_raises_peak_gpu_memory(stage, offload):
    base = run({"stage": stage, "reduce_bucket_size": 2_000_000})
    moved = run({"stage": stage, "reduce_bucket_size": 2_000_000, **offload})
    assert moved.peak_pool().peak <= base.peak_pool().peak
    assert sum(a.nbytes for a in moved.schedule.classes[0].host) > 0


def test_the_tokens_that_hide_the_offload_path_found_with_the_des_match_the_lectures_formula():
    """With the delayed update the CPU path (CPU-Adam + H2D; the D2H is already hidden in the
    backward) is hidden once the GPU path outlasts it. The DES's crossing point is the
    lecture's formula (reference/000 Sec. 4.4) at the DES's own GPU rate, 6 N FLOPs per
    token, with only the H2D direction on the CPU path; the formula with both directions
    is above it."""
    def gpu_path(r):
        return max(sp.end for sp in r.engine.spans if sp.rank == 0 and sp.op.stream is Stream.COMPUTE
                   and sp.op.phase.value == "bwd")

    first = lecture_7b(8192, delayed=True)
    cpu_path = first.step_time_s                               # max(GPU, CPU) with the GPU path shorter
    assert cpu_path > 1.2 * gpu_path(first)
    crossing = 8192 * cpu_path / gpu_path(first)               # the GPU path grows with the tokens
    n = 6.74e9
    rate = 6 * n * 8192 / gpu_path(first)                      # the DES's 6N FLOP/s
    per_param = 1 / 1.5e9 + 2 / 25e9                           # CPU-Adam + the 16-bit H2D
    assert crossing == pytest.approx(per_param * rate / 6, rel=0.02)
    # on either side of the crossing (whole sequences of 4,096 tokens, 15% or more away from it)
    below = max(8192, 4096 * int(0.85 * crossing // 4096))
    above = 4096 * -int(-1.15 * crossing // 4096)
    for tokens, hidden in ((below, False), (above, True), (above + 8192, True)):
        r = lecture_7b(tokens, delayed=True)
        assert (r.step_time_s <= 1.01 * gpu_path(r)) is hidden, (tokens, crossing)
    both_ways = tokens_to_hide_offload(cpu_adam_params_per_s=1.5e9, pcie_bandwidth=25e9, peak_flops=rate, mfu=1.0)
    assert crossing < both_ways < crossing * 1.15


def test_the_delayed_update_runs_beside_the_step_at_zero3_too():
    plain = run({"stage": 3, "offload_optimizer": "cpu"})
    dpu = run({"stage": 3, "offload_optimizer": "cpu"}, delayed_parameter_update=True)
    start = min(sp.start for sp in spans(dpu, CpuStep) if sp.op.params > 0)
    compute_end = max(sp.end for sp in dpu.engine.spans if sp.rank == 0 and sp.op.stream is Stream.COMPUTE
                      and sp.op.phase.value == "bwd")
    assert start < compute_end                    # CPU-Adam begins with the step, not after the backward
    assert dpu.step_time_s < plain.step_time_s


def _node_table(zero: dict, pp: int) -> dict:
    return {**table(zero), "parallel": {"tp": 1, "pp": pp},
            "training": {"seq_len": 512, "micro_batch": 2, "grad_accum": 4, "precision": "bf16"}}


@pytest.mark.parametrize("zero", [{"stage": 2, "offload_optimizer": "cpu"},
                                  {"stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"}])
def test_ranks_that_step_together_share_the_node_cpu_as_the_static_share_says(zero):
    from sim.des.engine import Mode
    s = scenario_from_table(_node_table(zero, 1), Path("s.toml"), "s")
    full, rep = simulate(s, mode=Mode.FULL), simulate(s, mode=Mode.REPRESENTATIVE)
    assert full.step_time_s == pytest.approx(rep.step_time_s, rel=1e-9)


def test_a_pipeline_stage_that_steps_first_has_the_node_cpu_to_itself_for_a_while():
    """ZeRO-1 + CPU offload with two pipeline stages on one node: the last stage ends its
    backward first, so its CPU-Adam starts with the node's CPU shared by 4 ranks, not 8;
    full mode (every rank simulated, the node's CPU one shared resource) sees it."""
    from sim.des.engine import Mode
    s = scenario_from_table(_node_table({"stage": 1, "offload_optimizer": "cpu"}, 2), Path("s.toml"), "s")
    full, rep = simulate(s, mode=Mode.FULL), simulate(s, mode=Mode.REPRESENTATIVE)
    adam = lambda r: [sp.end - sp.start for sp in r.engine.spans if isinstance(sp.op, CpuStep) and sp.op.params]  # noqa: E731
    assert min(adam(full)) < 0.99 * min(adam(rep))
    assert full.step_time_s < rep.step_time_s


def test_cpu_adam_is_a_roofline_of_the_cores_and_the_dram_bytes():
    from sim.analytic.opcost import ADAM_BYTES_PER_PARAM, cpu_adam_time
    c = scenario_from_table(table({"stage": 2, "offload_optimizer": "cpu"}), Path("s.toml"), "s").cluster
    host = c.host
    assert cpu_adam_time(1e9, c, 8) == pytest.approx(1e9 / (host.cpu_adam_params_per_s / 8))   # the cores bind
    slow_dram = replace(c, node=replace(c.node, host=replace(host, dram_bandwidth=20e9)))
    assert cpu_adam_time(1e9, slow_dram, 8) == pytest.approx(1e9 * ADAM_BYTES_PER_PARAM / (20e9 / 8))


@pytest.mark.parametrize("accumulation", [1, 3])
def test_zero3_offload_sends_every_reduced_partition_through_the_host_buffer_each_micro_step(accumulation):
    """stage3.py `partition_grads` with an offloaded optimizer: the gradient partitions live in
    a host buffer, so each bucket's partition goes to the host and back to the GPU on every
    micro-step (copy_ then .to(device) on the first; .to(device), add, copy_ on later ones)."""
    from sim.engines.plan import plan

    s = scenario_from_table(table({"stage": 3, "offload_optimizer": "cpu"}, grad_accum=accumulation),
                            Path("s.toml"), "s")
    ops = list(plan(s).ops(0))
    buckets = sum(1 for op in ops if op.name == "reduce_scatter bucket")
    round_trip = [op for op in ops if isinstance(op, Copy) and "host gradient buffer" in op.name]
    assert buckets >= accumulation and len(round_trip) == 2 * buckets
    assert all(op.stream is Stream.REDUCE and not op.pageable for op in round_trip)   # pinned by default
    per_step = {d: sum(op.nbytes for op in round_trip if op.direction is d) for d in (Stream.D2H, Stream.H2D)}
    partition = sum(op.nbytes for op in ops if op.name == "reduce_scatter bucket") / s.parallel.dp
    assert per_step[Stream.D2H] == pytest.approx(partition) and per_step[Stream.H2D] == pytest.approx(partition)
    first = [op for op in round_trip if op.micro_step == 0]
    assert first[0].direction is Stream.D2H and first[1].direction is Stream.H2D
    if accumulation > 1:
        later = [op for op in round_trip if op.micro_step == 1]
        assert later[0].direction is Stream.H2D and later[1].direction is Stream.D2H
    # the round trip lengthens the step: without it (stage 3 on the GPU) nothing goes through the host
    gpu = scenario_from_table(table({"stage": 3}, grad_accum=accumulation), Path("s.toml"), "s")
    assert not [op for op in plan(gpu).ops(0) if isinstance(op, Copy) and "host gradient buffer" in op.name]
