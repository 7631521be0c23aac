"""Functional ZeRO (issue: validation item 5): the planner's paper schedules, executed
numerically on virtual ranks, train exactly like data parallelism."""

from __future__ import annotations

import numpy as np
import pytest

from sim.validate.functional import LECTURE_MLP, parameters, train

K, PSI, SEG = 4, 52_552, 52_552 // 4
# per-rank stored elements (fp32 params, grads, Adam m and v): stage formula + stated buffers
FORMULA = {0: 4 * PSI, 1: 2 * PSI + 2 * PSI // K, 2: PSI + 3 * PSI // K, 3: 4 * PSI // K}
BUFFERS = {0: 0, 1: 0,
           2: 2 * SEG,   # gradients of the segment about to be reduced + the next one the boundary layer started
           3: 4 * SEG}   # those two + the broadcast segment in use + the one prefetched


@pytest.fixture(scope="module")
def runs():
    return {stage: train(LECTURE_MLP, K, stage, steps=10) for stage in range(4)}


def test_the_lecture_mlp():
    assert LECTURE_MLP.params == 52_552 and max(LECTURE_MLP.layer_sizes) == 4_160
    assert len(LECTURE_MLP.layer_sizes) == 14


def test_all_stages_train_bitwise_identically(runs):
    reference = parameters(runs[0])
    assert not np.isnan(reference).any()
    for stage in (1, 2, 3):
        assert np.array_equal(parameters(runs[stage]), reference), stage
    assert not np.array_equal(reference, train(LECTURE_MLP, K, 0, steps=0).state[0].params)


@pytest.mark.parametrize("stage", range(4))
def test_stored_elements_are_the_formula_plus_the_stated_buffers(runs, stage):
    assert max(runs[stage].peak_stored) == FORMULA[stage] + BUFFERS[stage]


@pytest.mark.parametrize(("stage", "factor"), [(0, 2), (1, 2), (2, 2), (3, 3)])
def test_collective_volumes_are_2_or_3_psi(runs, stage, factor):
    per_rank = 0.0
    for entry in runs[stage].log:
        if entry["step"] == 1:
            share = 2 * (K - 1) / K if entry["op"] == "all_reduce" else (K - 1) / K
            per_rank += entry["elements"] * share
    assert per_rank == pytest.approx(factor * PSI * (K - 1) / K, rel=1e-12)


def test_every_collective_is_logged_with_what_each_rank_stores(runs):
    entries = [e for e in runs[3].log if e["step"] == 1]
    assert {e["op"] for e in entries} == {"broadcast", "reduce"}
    assert len([e for e in entries if e["op"] == "broadcast"]) == 2 * K   # forward and backward
    assert all(len(e["stored"]) == K for e in entries)
