"""DeepSpeed ZeRO-0/1/2/3 on gloo (its CPU accelerator) against the DeepSpeed planners:
the collectives of a step in order and bytes, and the optimizer's bytes per rank."""

from __future__ import annotations

import pytest

from sim.validate.compare import planned, planned_state, recorded, validation_scenario
from sim.validate.torch_runs import spawn

pytest.importorskip("deepspeed")   # in the test extra; skipped only where it is not installed

MODEL = {"layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2, "ffn_hidden": 384, "vocab": 2048}
WIDE = {"layers": 2, "hidden": 384, "heads": 6, "kv_heads": 2, "ffn_hidden": 1024, "vocab": 2048}
# ZeRO-3 with modules above the persistence threshold, small prefetch buckets and no reuse:
# per-module fetches, coalesced prefetches and bucketed reduce-scatters
PER_MODULE = {"stage3_prefetch_bucket_size": 300_000, "stage3_max_reuse_distance": 0, "reduce_bucket_size": 1_000_000}
CASES = [(world, accum, stage, MODEL, {}) for world, accum in ((2, 1), (4, 2)) for stage in range(4)]
CASES.append((2, 1, 3, WIDE, PER_MODULE))


def _config(world: int, accum: int, model: dict, zero: dict, stage: int) -> dict:
    return {"model": model, "seq_len": 32, "micro_batch": 2, "grad_accum": accum, "steps": 3,
            "zero": {"stage": stage, **zero}}


@pytest.fixture(scope="module")
def runs():
    """Every case of a world in one process group (the `cases` worker), started once per world
    when a test first asks for it: one start and one import of DeepSpeed for all its stages."""
    done: dict[int, list[list]] = {}

    def of(index: int) -> list:
        world = CASES[index][0]
        if world not in done:
            mine = [c for c in CASES if c[0] == world]
            configs = [_config(w, a, m, z, s) for w, a, s, m, z in mine]
            ranks = spawn(world, "cases", {"worker": "train_deepspeed", "cases": configs})
            done[world] = [[r["cases"][i] for r in ranks] for i in range(len(mine))]
        return done[world][[i for i, c in enumerate(CASES) if c[0] == world].index(index)]
    return of


@pytest.fixture(params=range(len(CASES)),
                ids=[f"zero{c[2]}-world{c[0]}-accum{c[1]}{'-per-module' if c[4] else ''}" for c in CASES])
def case(request, runs):
    world, accum, stage, model, zero = CASES[request.param]
    scenario = validation_scenario(f"deepspeed-zero{stage}", model, world, seq_len=32, micro_batch=2,
                                   grad_accum=accum, zero=zero)
    return scenario, runs(request.param), stage


def test_collective_sequence_matches_exactly(case):
    scenario, ranks, _ = case
    plan = planned(scenario)
    for rank in ranks:
        assert recorded(rank["log"], 2) == plan


def test_optimizer_bytes_match_exactly(case):
    scenario, ranks, stage = case
    if stage == 0:
        pytest.skip("DeepSpeed without ZeRO keeps a plain torch optimizer (no ZeRO partitions)")
    assert {r["optimizer_bytes"] for r in ranks} == {planned_state(scenario)["optimizer"]}
