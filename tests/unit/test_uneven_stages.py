"""Uneven pipeline stages (`[parallel] first_stage_layers` / `last_stage_layers`, as
Megatron-Core's --decoder-first/last-pipeline-num-layers): which blocks each stage holds, that
the engines place and run exactly those, that the memory report follows, and what is refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sim.analytic.params import total_params
from sim.analytic.placement import params_per_stage
from sim.analytic.stages import Stages
from sim.core.errors import InputError
from sim.inputs.load import scenario_from_table
from sim.inputs.models import model_from_table
from sim.results.memory_report import scenario_report
from sim.simulate import simulate
from sim.studies.check import check_rows, holds
from tests.crosscheck.scenarios import STRATEGIES, TINY_MODEL, tiny


def test_the_end_stages_take_what_is_given_and_the_others_share_the_rest():
    split = Stages(126, 16, first=7, last=7)             # Llama 3's 405B pipeline (paper Sec. 3.3.2)
    assert split.counts() == (7,) + (8,) * 14 + (7,) and split.problem() is None
    assert list(split.blocks(0)) == list(range(7)) and list(split.blocks(15)) == list(range(119, 126))
    assert split.stage_of(6) == 0 and split.stage_of(7) == 1 and split.stage_of(125) == 15
    assert Stages(70, 12, first=5, last=5).counts() == (5,) + (6,) * 10 + (5,)
    assert Stages(4, 2, first=1).counts() == (1, 3) and Stages(4, 2, last=3).counts() == (1, 3)
    assert Stages(8, 4).counts() == (2, 2, 2, 2) and not Stages(8, 4).uneven


@pytest.mark.parametrize(("split", "words"), [(Stages(10, 4, first=3), "not a whole"),
                                              (Stages(4, 2, first=5), "not a whole"),
                                              (Stages(10, 4), "does not divide"),
                                              (Stages(4, 1, first=2), "pp >= 2")])
def test_splits_that_cannot_be_built_say_why(split, words):
    assert words in (split.problem() or "")


@pytest.mark.parametrize("split", [Stages(4, 2, first=1), Stages(4, 2, last=1), Stages(4, 2)])
def test_the_stages_hold_every_parameter_once(split):
    model = model_from_table(TINY_MODEL, Path("t.toml"))
    assert sum(params_per_stage(model, 1, split)) == pytest.approx(total_params(model))
    blocks = params_per_stage(model, 1, split)
    if split.uneven:              # one block and the embedding against three blocks and the head
        assert (blocks[0] < blocks[1]) == (split.counts()[0] < split.counts()[1])


def block_names(result, stage: int) -> set[str]:
    return {m.group(1) for op in result.schedule.ops(stage) if (m := re.search(r"layers\.(\d+)", op.name))}


@pytest.mark.parametrize("strategy", ["ds-zero1-pp2-first-1", "megatron-distopt-tp2-pp2-last-1", "fsdp2-pp2-first-3"])
def test_each_stage_runs_exactly_its_blocks_and_the_twin_agrees(strategy):
    s = tiny(strategy, grad_accum=4)
    result = simulate(s)
    counts = s.stages.counts()
    assert block_names(result, 0) == {str(b) for b in range(counts[0])}
    assert block_names(result, 1) == {str(b) for b in range(counts[0], 4)}
    failed = [row for row in check_rows(result) if not holds(row[1], row[2], row[3])]
    assert not failed


def test_moving_blocks_off_the_first_stage_moves_its_memory_and_the_even_split_is_unchanged():
    even = simulate(tiny("ds-zero1-tp2-pp2"))
    explicit = simulate(tiny("ds-zero1-tp2-pp2", strategy_table={
        **STRATEGIES["ds-zero1-tp2-pp2"], "parallel": {"tp": 2, "pp": 2, "first_stage_layers": 2}}))
    assert explicit.step_time_s == even.step_time_s
    light = tiny("ds-zero1-pp2-first-1", grad_accum=4)
    report = scenario_report(light)
    assert report.pipeline_stage == 1            # three blocks and the head outweigh one block and the embedding
    assert report.rows[report.this_stage].total_bytes >= simulate(light).peak_pool().peak


def table(parallel: dict) -> dict:
    return {"model": TINY_MODEL, "cluster": "dgx-a100-80g", "nodes": 1, "zero": {"stage": 1},
            "parallel": parallel, "training": {"seq_len": 512, "micro_batch": 2, "grad_accum": 4, "precision": "bf16"}}


@pytest.mark.parametrize(("parallel", "key", "words"), [
    ({"pp": 2, "first_stage_layers": 5}, "parallel.first_stage_layers", "not a whole"),
    ({"pp": 2, "virtual_stages": 2, "first_stage_layers": 1}, "parallel.first_stage_layers", "not simulated yet"),
    ({"pp": 1, "last_stage_layers": 1}, "parallel.last_stage_layers", "need a pipeline"),
    ({"pp": 8}, "parallel.pp", "first_stage_layers / last_stage_layers")])
def test_bad_splits_are_refused_naming_the_key(parallel, key, words):
    with pytest.raises(InputError) as err:
        simulate(scenario_from_table(table(parallel), Path("s.toml"), "s"))
    assert key in str(err.value) and words in str(err.value)
