"""Which blocks full recomputation checkpoints: Megatron's uniform chunks of N blocks and
its block method (the first N blocks of a stage), in the planner, the memory report and
the analytic twin."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from sim.analytic.recompute import RecomputePlan
from sim.core.errors import InputError
from sim.engines.schedule import Compute, Mem
from sim.inputs.load import scenario_from_table
from sim.results.memory_report import scenario_report
from sim.simulate import simulate
from sim.studies.check import check_rows, holds
from tests.crosscheck.scenarios import TINY_MODEL, tiny, without_host

DEEP = {**TINY_MODEL, "layers": 8, "vocab": 1024}   # a small head: the recompute working set sets the peak, not the loss


def with_plan(s, method: str, layers: int):
    return replace(s, training=replace(s.training, recompute_method=method, recompute_layers=layers))


def scenario(strategy: str = "ds-zero1", method: str = "uniform", layers: int = 1, **kw):
    return without_host(with_plan(tiny(strategy, recompute="full", model=DEEP, **kw), method, layers))


def test_segments_follow_megatrons_uniform_and_block_methods():
    assert [list(r) for r in RecomputePlan("uniform", 3).segments(8)] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert [list(r) for r in RecomputePlan("block", 3).segments(8)] == [[0], [1], [2]]
    assert RecomputePlan("uniform", 3).recomputed(8) == 8 and RecomputePlan("block", 3).recomputed(8) == 3
    assert RecomputePlan("uniform", 3).working(8) == 3 and RecomputePlan("block", 9).working(8) == 1


def recomputed_blocks(r) -> list[int]:
    ops = [op for op in r.schedule.ops(0) if isinstance(op, Compute) and op.name.startswith("recompute")]
    return sorted({op.layer for op in ops if op.micro_step == 0})


def activation_peak(r) -> float:
    return r.peak_pool().peak_breakdown.get(Mem.ACTIVATIONS, 0.0)


def test_uniform_chunks_recompute_the_same_work_with_fewer_checkpoints_and_a_larger_working_set():
    one, four = (simulate(scenario(layers=n)) for n in (1, 4))
    assert recomputed_blocks(one) == recomputed_blocks(four) == list(range(8))
    assert four.breakdown.compute_s == pytest.approx(one.breakdown.compute_s, rel=1e-9)
    assert four.hardware_flops == one.hardware_flops
    # a chunk of four recomputed at once: more live at the peak than one block at a time
    assert activation_peak(four) > activation_peak(one)


def test_the_block_method_recomputes_only_the_first_n_blocks():
    runs = {n: simulate(scenario(method="block", layers=n)) for n in (2, 8)}
    assert recomputed_blocks(runs[2]) == [0, 1]
    assert recomputed_blocks(runs[8]) == list(range(8))
    assert runs[2].breakdown.compute_s < runs[8].breakdown.compute_s
    assert runs[2].hardware_flops < runs[8].hardware_flops
    assert activation_peak(runs[2]) > activation_peak(runs[8])   # six blocks keep everything


@pytest.mark.parametrize(("method", "layers"), [("uniform", 3), ("block", 2)])
@pytest.mark.parametrize("strategy", ["ds-zero3-tp2-full-recompute", "ds-zero1-tp2-pp2", "fsdp2"])
def test_des_agrees_with_the_analytic_twin(strategy, method, layers):
    r = simulate(with_plan(tiny(strategy, recompute="full", model=DEEP), method, layers))
    for name, des, analytic, relation in check_rows(r):
        assert holds(des, analytic, relation), (name, des, analytic, relation)


def test_the_memory_report_bounds_the_planners_activations_and_moves_with_them():
    # the report adds the recompute working set to every checkpoint and the head at once: an
    # upper estimate of the planner's peak, in the same order across the methods
    cases = [("uniform", 1), ("uniform", 2), ("uniform", 4), ("block", 3), ("block", 1)]
    report, des = [], []
    for method, layers in cases:
        s = scenario(method=method, layers=layers, grad_accum=1)
        report.append(scenario_report(s).rows[0].activations_bytes)
        des.append(activation_peak(simulate(s)))
    assert all(r >= d for r, d in zip(report, des)), (report, des)
    assert sorted(range(len(cases)), key=report.__getitem__) == sorted(range(len(cases)), key=des.__getitem__)


def table(**training) -> dict:
    return {"model": TINY_MODEL, "cluster": "dgx-a100-80g", "nodes": 1, "zero": {"stage": 1},
            "training": {"seq_len": 512, "micro_batch": 2, "grad_accum": 1, "precision": "bf16", **training}}


def test_the_keys_need_full_recomputation():
    s = scenario_from_table(table(recompute="full", recompute_method="block", recompute_num_layers=2),
                            Path("s.toml"), "s")
    assert s.training.recompute_plan == RecomputePlan("block", 2)
    with pytest.raises(InputError, match="training.recompute_num_layers.*recompute = \"full\""):
        scenario_from_table(table(recompute="selective", recompute_num_layers=2), Path("s.toml"), "s")
    with pytest.raises(InputError, match="training.recompute_method.*uniform, block"):
        scenario_from_table(table(recompute="full", recompute_method="every"), Path("s.toml"), "s")


def checkpointed(strategy: str, *, partition: bool = False, cpu: bool = False, **kw):
    s = tiny(strategy, recompute="full", model=DEEP, **kw)
    return replace(s, training=replace(s.training, partition_activations=partition, cpu_checkpointing=cpu))


def test_partitioned_checkpoints_are_gathered_over_tp_before_each_recomputation():
    plain, split = (simulate(checkpointed("ds-zero1-tp2-pp2", partition=p)) for p in (False, True))
    gathers = [op for op in split.schedule.ops(0) if op.name == "all-gather partitioned checkpoint"]
    assert len(gathers) == 4 * split.scenario.training.grad_accum        # 4 blocks on stage 0, one each
    assert not [op for op in plain.schedule.ops(0) if op.name == "all-gather partitioned checkpoint"]
    for name, des, analytic, relation in check_rows(split):
        assert holds(des, analytic, relation), (name, des, analytic, relation)


def test_cpu_checkpoints_cross_pcie_both_ways_and_leave_the_device():
    on_device, on_host = (simulate(checkpointed("ds-zero2", cpu=c)) for c in (False, True))
    copies = [op for op in on_host.schedule.ops(0) if "checkpoint of block" in op.name]
    per_step = 8 * on_host.scenario.training.grad_accum
    assert len([op for op in copies if "to the host" in op.name]) == per_step
    assert len([op for op in copies if "from the host" in op.name]) == per_step
    assert all(op.pageable for op in copies)      # `.to("cpu")` makes a fresh pageable tensor, both ways
    assert activation_peak(on_host) < activation_peak(on_device)
    assert on_host.step_time_s > on_device.step_time_s


def with_fresh_rate(s, gbps: float):
    host = replace(s.cluster.node.host, fresh_pageable_d2h=gbps * 1e9)
    return replace(s, cluster=replace(s.cluster, node=replace(s.cluster.node, host=host)))


def test_a_checkpoint_goes_to_the_host_at_the_rate_of_a_fresh_pageable_tensor():
    """`.to("cpu")` allocates the pageable tensor it copies into, so the D2H takes that
    memory's first-touch faults (HostSpec.fresh_pageable_d2h, pytorch/pytorch#138018); the
    H2D back reads memory already touched and runs at the pageable rate."""
    s = without_host(checkpointed("ds-zero2", cpu=True))    # device-bound: the copy's time is the step's
    slow, fast = (simulate(with_fresh_rate(s, gbps)) for gbps in (1.4, 1000.0))
    copies = [op for op in slow.schedule.ops(0) if "checkpoint of block" in op.name]
    assert copies and all(op.fresh == ("to the host" in op.name) for op in copies)
    down = next(op for op in copies if op.fresh)
    extra = (slow.step_time_s - fast.step_time_s) / len([op for op in copies if op.fresh])
    rate = s.cluster.host.pcie.achievable_bandwidth / s.cluster.host.gpus_per_pcie_switch
    pageable_s, fresh_s = down.nbytes / (rate * s.cluster.host.pcie_pageable_efficiency), down.nbytes / 1.4e9
    assert extra == pytest.approx(fresh_s - pageable_s, rel=0.05)   # blocking, on the compute stream
    for name, des, analytic, relation in check_rows(slow):
        assert holds(des, analytic, relation), (name, des, analytic, relation)


def contiguous_table(**training) -> dict:
    return {"model": DEEP, "cluster": "dgx-a100-80g", "nodes": 1, "parallel": {"tp": 2}, "zero": {"stage": 1},
            "training": {"seq_len": 512, "micro_batch": 2, "grad_accum": 1, "precision": "bf16", "recompute": "full",
                         "partition_activations": True, **training}}


def test_contiguous_checkpoints_copy_each_partition_again_and_hold_the_unused_buffers():
    """DeepSpeed's contiguous_memory_optimization (checkpointing.py `partition_activations`):
    each checkpoint's partition is cloned, then copied into one of `number_checkpoints`
    buffers that the first checkpoint allocates; the 4 buffers no block of this 8-block
    model fills are held until the first backward, in the DES and in the memory report."""
    run = lambda **kw: simulate(scenario_from_table(contiguous_table(**kw), Path("s.toml"), "s"))  # noqa: E731
    plain = run()
    exact = run(contiguous_memory_optimization=True, number_checkpoints=8)
    spare = run(contiguous_memory_optimization=True, number_checkpoints=12)
    copies = lambda r: [k for op in r.schedule.ops(0) if isinstance(op, Compute) for k in op.kernels  # noqa: E731
                        if "contiguous buffer" in k.name]
    clones = [k for op in plain.schedule.ops(0) if isinstance(op, Compute) for k in op.kernels if "clone" in k.name]
    assert len(clones) == 8 and not copies(plain) and len(copies(exact)) == 8
    assert exact.step_time_s > plain.step_time_s
    checkpoint = clones[0].bytes / 2
    unused = [op for op in spare.schedule.ops(0) for a in op.alloc if a.label.startswith("unused contiguous")]
    assert [a.nbytes for a in unused[0].alloc] == [pytest.approx(4 * checkpoint)]
    report = lambda r: scenario_report(r.scenario).rows[0].activations_bytes  # noqa: E731
    assert report(spare) - report(exact) == pytest.approx(4 * checkpoint)
    assert report(exact) == pytest.approx(report(plain))


@pytest.mark.parametrize("training, key, words", [
    ({"contiguous_memory_optimization": True, "number_checkpoints": 8, "partition_activations": False},
     "training.contiguous_memory_optimization", "with partition_activations = true"),
    ({"contiguous_memory_optimization": True}, "training.number_checkpoints", "number of checkpoints"),
])
def test_contiguous_checkpoints_need_partitions_and_a_count(training, key, words):
    with pytest.raises(InputError, match=words) as e:
        scenario_from_table(contiguous_table(**training), Path("s.toml"), "s")
    assert e.value.key == key
    pipelined = {**contiguous_table(contiguous_memory_optimization=True, number_checkpoints=4),
                 "parallel": {"tp": 2, "pp": 2}}
    with pytest.raises(InputError, match="not simulated yet"):
        scenario_from_table(pipelined, Path("s.toml"), "s")
