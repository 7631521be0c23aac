"""DeepSpeed ZeRO-3 as v0.3.13-v0.5.4 ran it (`[zero] deepspeed_version = "0.5"`): one
all-gather per partitioned parameter after a device synchronize, its list output copied out
in dp chunks, nothing overlapped; one reduce_scatter per gradient; the same bytes as the
coalesced engine of later versions, and what it is not simulated with."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.core.errors import InputError
from sim.engines.schedule import Collective, Compute
from sim.inputs.load import scenario_from_table
from sim.simulate import simulate, volume_by_kind
from tests.crosscheck.scenarios import TINY_MODEL, tiny


@pytest.fixture(scope="module")
def runs():
    return simulate(tiny("ds-zero3-v05", nodes=2)), simulate(tiny("ds-zero3", nodes=2))


def test_each_partitioned_parameter_is_gathered_alone_and_its_chunks_copied_out(runs):
    legacy, _ = runs
    ops = list(legacy.schedule.ops(0))
    gathers = [op for op in ops if isinstance(op, Collective) and op.name.endswith("(one parameter)")]
    copies = [op for op in ops if isinstance(op, Compute) and op.name.startswith("all_gather list output")]
    dp = legacy.scenario.parallel.dp
    assert gathers and len(copies) == len(gathers)
    assert all(len(op.kernels) == dp and op.pieces == dp for op in copies)
    waited = {ref for op in ops for ref in op.synced}
    assert all(op.id in waited for op in copies)   # _synchronize_communication: the host waits for each


def test_it_moves_the_bytes_the_coalesced_engine_moves(runs):
    legacy, current = runs
    assert volume_by_kind(legacy) == pytest.approx(volume_by_kind(current))


def test_nothing_hides_its_gathers_so_it_is_slower_than_prefetching_them(runs):
    legacy, _ = runs
    prefetching = simulate(tiny("ds-zero3-prefetch", nodes=2))
    assert legacy.step_time_s > prefetching.step_time_s
    assert legacy.breakdown.exposed_comm_s + legacy.breakdown.exposed_host_s > \
        prefetching.breakdown.exposed_comm_s + prefetching.breakdown.exposed_host_s


def table(zero: dict) -> dict:
    return {"model": TINY_MODEL, "cluster": "dgx-a100-80g", "nodes": 1, "zero": zero,
            "training": {"seq_len": 512, "micro_batch": 2, "grad_accum": 2, "precision": "bf16"}}


@pytest.mark.parametrize(("zero", "words"), [
    ({"stage": 2, "deepspeed_version": "0.5"}, "ZeRO stage 2"),
    ({"stage": 3, "deepspeed_version": "0.5", "offload_optimizer": "cpu"}, "offload"),
    ({"stage": 3, "deepspeed_version": "0.5", "zero_quantized_weights": True}, "ZeRO++"),
    ({"stage": 1, "deepspeed_version": "0.6"}, "ZeRO stage 1"),
    ({"stage": 3, "deepspeed_version": "0.4"}, "0.19, 0.6, 0.5")])
def test_what_it_is_not_simulated_with_is_refused(zero, words):
    with pytest.raises(InputError) as err:
        simulate(scenario_from_table(table(zero), Path("s.toml"), "s"))
    assert "zero.deepspeed_version" in str(err.value) and words in str(err.value)
