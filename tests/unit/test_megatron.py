"""The Megatron-Core engine model: its buckets, memory, overlaps and argument checks."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from sim.core.errors import InputError
from sim.engines.buckets import megatron_bucket_size, megatron_buckets
from sim.engines.megatron import MegatronPlanner
from sim.engines.plan import layout_of, model_of, resident_memory
from sim.engines.schedule import Mem
from sim.inputs.load import scenario_from_table
from sim.simulate import simulate
from tests.crosscheck.scenarios import TINY_MODEL, tiny, without_host

MID = {"name": "mid", "layers": 8, "hidden": 2048, "heads": 16, "kv_heads": 16, "ffn_hidden": 5504,
       "vocab": 32000}


def megatron(nodes: int = 2, tp: int = 1, dp_busbw: float = 100.0, **flags):
    parallel = {"tp": tp, "sequence_parallel": tp > 1}
    s = tiny("megatron", model=MID, nodes=nodes, seq_len=2048, micro_batch=2, grad_accum=2,
             comm={"busbw_GBps": {"dp": dp_busbw}},
             strategy_table={"megatron": flags, "parallel": parallel})
    return without_host(s)


def exposed(r, kind: str) -> float:
    return sum(v for k, v in r.breakdown.exposed_by_kind.items() if k.startswith(kind))


def test_buckets_close_once_they_reach_the_size_in_reverse_parameter_order():
    got = megatron_buckets([30, 20, 50, 5], 40, dp=4, distributed_optimizer=False)
    assert [(b.start, b.stop, b.elements) for b in got] == [(0, 2, 50), (2, 3, 50), (3, 4, 5)]
    assert len(megatron_buckets([30, 20, 50, 5], None, dp=4, distributed_optimizer=False)) == 1


def test_distributed_optimizer_pads_params_to_64_and_buckets_to_lcm_dp_128():
    (b,) = megatron_buckets([100, 3], None, dp=48, distributed_optimizer=True)
    assert b.elements == 384          # 100 -> 128 (next start), + 3 = 131, up to lcm(48, 128) = 384


def test_default_bucket_is_40m_or_1m_per_rank():
    assert megatron_bucket_size(8, None) == 40_000_000
    assert megatron_bucket_size(48, None) == 48_000_000
    assert megatron_bucket_size(48, 1000) == 1000


def test_stages_after_the_first_keep_one_bucket():
    s = tiny("megatron", strategy_table={"megatron": {"overlap_grad_reduce": True, "bucket_size": 100_000},
                                         "parallel": {"pp": 2}})
    first, second = (MegatronPlanner(s, layout_of(s), k) for k in (0, 1))
    assert len(first.buckets) > 1
    assert len(second.buckets) == 1


@pytest.mark.parametrize(("precision", "distributed", "per_param"), [
    ("bf16", False, lambda d: 18.0), ("bf16", True, lambda d: 6.0 + 12.0 / d),
    ("fp32", False, lambda d: 16.0), ("fp32", True, lambda d: 8.0 + 8.0 / d)])
def test_model_states_follow_megatrons_bytes_per_parameter_table(precision, distributed, per_param):
    s = tiny("megatron", nodes=2, strategy_table={"megatron": {"distributed_optimizer": distributed}})
    s = replace(s, training=replace(s.training, precision=type(s.training.precision)(precision)))
    r = resident_memory(s)
    states = sum(r.device_bytes(m) for m in (Mem.PARAMS, Mem.GRADS, Mem.OPTIMIZER))
    psi = r.device_bytes(Mem.GRADS) / 4
    assert states / psi == pytest.approx(per_param(s.parallel.dp), rel=2e-3)


def test_overlapped_gradient_reduction_hides_behind_backward():
    blocking, overlapped = (simulate(megatron(overlap_grad_reduce=o)) for o in (False, True))
    assert exposed(overlapped, "all_reduce (grad bucket)") < 0.5 * exposed(blocking, "all_reduce (grad bucket)")
    assert overlapped.step_time_s < blocking.step_time_s


def test_overlapped_param_gather_hides_behind_the_next_forward():
    flags = {"distributed_optimizer": True, "overlap_grad_reduce": True}
    blocking = simulate(megatron(**flags))
    overlapped = simulate(megatron(**flags, overlap_param_gather=True))
    assert exposed(overlapped, "all_gather (param bucket)") < 0.5 * exposed(blocking, "all_gather (param bucket)")
    assert overlapped.step_time_s < blocking.step_time_s


def test_tp_comm_overlap_exposes_less_tensor_parallel_time():
    blocking = simulate(megatron(nodes=1, tp=2))
    overlapped = simulate(megatron(nodes=1, tp=2, tp_comm_overlap=True))
    tp = [sum(v for k, v in r.breakdown.exposed_by_kind.items() if "tensor parallel" in k)
          for r in (blocking, overlapped)]
    assert tp[1] < 0.5 * tp[0], tp
    assert overlapped.step_time_s < blocking.step_time_s


def table(**megatron_flags) -> dict:
    return {"model": TINY_MODEL, "cluster": "dgx-a100-80g", "nodes": 1, "megatron": megatron_flags,
            "training": {"seq_len": 512, "micro_batch": 2, "grad_accum": 1, "precision": "bf16"}}


@pytest.mark.parametrize(("flags", "needs"), [
    ({"overlap_param_gather": True, "overlap_grad_reduce": True}, "distributed_optimizer"),
    ({"overlap_param_gather": True, "distributed_optimizer": True}, "overlap_grad_reduce")])
def test_megatrons_own_argument_checks_refuse_with_its_reason(flags, needs):
    with pytest.raises(InputError, match=f"megatron.overlap_param_gather.*{needs}"):
        scenario_from_table(table(**flags), Path("s.toml"), "s")


def test_tp_comm_overlap_without_sequence_parallelism_is_refused():
    t = table(tp_comm_overlap=True)
    t["parallel"] = {"tp": 2}
    s = scenario_from_table(t, Path("s.toml"), "s")
    with pytest.raises(InputError, match="megatron.tp_comm_overlap.*sequence_parallel"):
        model_of(s)


def test_a_megatron_table_under_another_engine_is_refused():
    t = table()
    t["engine"] = "ddp"
    with pytest.raises(InputError, match=r"engine 'ddp' \(given\) does not match the \[megatron\] settings"):
        scenario_from_table(t, Path("s.toml"), "s")
    t = {**table(), "ddp": {}}
    with pytest.raises(InputError, match=r"engine 'megatron' \(implied by \[megatron\]\) does not match the \[ddp\]"):
        scenario_from_table(t, Path("s.toml"), "s")


def test_a_bucket_size_without_overlapped_reduction_is_refused():
    with pytest.raises(InputError, match="megatron.bucket_size.*overlap_grad_reduce = true"):
        scenario_from_table(table(bucket_size=1000), Path("s.toml"), "s")
