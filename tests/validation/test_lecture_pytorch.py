"""The lecture's PyTorch observations (reference/000 Secs. 3.2-3.3, 4.1, 4.5), reproduced."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sim.engines.ddp import greedy_partition
from sim.validate.lecture import checkpoint_saved_elements, quantization_errors
from sim.validate.torch_models import lecture_mlp
from sim.validate.torch_runs import spawn

PSI = 281_864


@pytest.fixture(scope="module")
def runs():
    keys = (("ddp", False), ("ddp-zero-redundancy", False), ("fsdp2", False), ("ddp", True), ("fsdp2", True))
    ranks = spawn(4, "cases", {"worker": "compare_mlp", "cases": [{"strategy": s, "steps": 5, "float64": f64} for s, f64 in keys]})
    return {key: [r["cases"][i] for r in ranks] for i, key in enumerate(keys)}


def test_zero_redundancy_state_sums_to_one_full_adam_state(runs):
    assert sum(r["state_numel"] for r in runs[("ddp-zero-redundancy", False)]) == 2 * PSI
    assert runs[("ddp", False)][0]["state_numel"] == 2 * PSI


def test_zero_redundancy_trains_bitwise_like_ddp(runs):
    ddp, zero = runs[("ddp", False)][0]["params"], runs[("ddp-zero-redundancy", False)][0]["params"]
    assert torch.equal(ddp, zero)


def test_greedy_partition_is_uneven_and_the_planner_models_it(runs):
    torch_loads = [sum(p) for p in runs[("ddp-zero-redundancy", False)][0]["partition"]]
    sizes = [p.numel() for p in lecture_mlp().parameters()]
    ours = [sum(sizes[i] for i in own) for own in greedy_partition(sizes, 4)]
    assert ours == torch_loads
    assert max(torch_loads) / (PSI / 4) == pytest.approx(1.16, abs=0.005)


def test_fsdp2_shards_dim0_and_holds_a_quarter(runs):
    fsdp = runs[("fsdp2", False)]
    assert (64, 256) in fsdp[0]["local_shapes"]           # a (256, 256) weight on 4 ranks
    assert [r["local_params"] for r in fsdp] == [PSI // 4] * 4   # 70,466 each: no padding needed here
    assert all(r["state_numel"] == 2 * r["local_params"] for r in fsdp)


def test_fsdp2_differs_from_ddp_only_by_rounding(runs):
    d32 = (runs[("fsdp2", False)][0]["params"] - runs[("ddp", False)][0]["params"]).abs().max().item()
    d64 = (runs[("fsdp2", True)][0]["params"] - runs[("ddp", True)][0]["params"]).abs().max().item()
    assert 0 < d32 < 1e-5           # lecture: about 5.8e-6 in float32
    assert 0 <= d64 < 1e-13         # lecture: about 5.5e-15 in float64


def test_activation_checkpointing_saves_the_block_inputs_only():
    # 12 blocks, input 64 x 128 x 256: every block saves its LayerNorm input and statistics,
    # both Linear inputs and the GELU input; one checkpoint per block keeps its input alone.
    plain, checkpointed = checkpoint_saved_elements(blocks=12, shape=(64, 128, 256))
    tokens, h, f = 64 * 128, 256, 1024
    assert plain == 12 * tokens * (h + 1 + 1 + h + f + f)
    assert checkpointed == 12 * tokens * h
    assert 9 < plain / checkpointed < 11     # lecture: checkpointing saves 9-60x


def test_blockwise_quantization_beats_per_tensor():
    err = quantization_errors(n=2**20, outliers=64, scale=20.0, block=256, seed=0)   # "1M" weights
    assert err["int8_tensor"] == pytest.approx(0.1125, rel=0.15)   # lecture: 11.25%
    assert err["int8_block"] == pytest.approx(0.0089, rel=0.15)    # 0.89%
    assert err["int4_tensor"] == pytest.approx(0.9869, rel=0.05)   # 98.69%
    assert err["int4_block"] == pytest.approx(0.1453, rel=0.15)    # 14.53%
    assert np.isfinite(list(err.values())).all()
