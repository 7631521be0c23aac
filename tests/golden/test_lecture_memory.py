"""Golden numbers of the ZeRO lecture (shared/reference/000_*.txt) and the ZeRO paper.

Each test names the section it reproduces and the accounting convention it uses.
"""

from __future__ import annotations

import math

import pytest

from sim.analytic.memory import fused_flat_buffer_bytes, largest_trainable_params, model_state_bytes
from sim.core.enums import Convention, ZeroStage

GB = 1e9
STAGES = list(ZeroStage)


# ZeRO paper Fig. 1 / lecture Sec. 2.1: Psi = 7.5B, N_d = 64, K = 12.
@pytest.mark.parametrize(("stage", "expected_gb"), list(zip(STAGES, [120.0, 31.4, 16.6, 1.9])))
def test_zero_paper_figure_1(stage, expected_gb):
    got = model_state_bytes(7.5e9, 64, stage).total / GB
    assert got == pytest.approx(expected_gb, abs=0.05)


def test_slides_7b_on_4_gpus_is_zero3_30gb():
    # Lecture Sec. 2.1: "7B model 120 GB -> 30 GB (4 GPUs)" is ZeRO-3 with 7.5B on 4 GPUs.
    assert model_state_bytes(7.5e9, 4, ZeroStage.PARAMETERS).total / GB == pytest.approx(30.0)


def test_llama3_8b_20_byte_accounting():
    # Lecture Sec. 1.2 (slide 12): params 16 GB, grads 16 GB, optimizer 128 GB = 160 GB.
    s = model_state_bytes(8e9, 1, ZeroStage.NONE, Convention.LECTURE)
    assert (s.params / GB, s.grads / GB, s.optimizer / GB, s.total / GB) == pytest.approx(
        (16.0, 16.0, 128.0, 160.0))


def test_gpt3_175b_20_byte_accounting():
    # Lecture Sec. 1.2: GPT-3 175B needs 3500 GB of model states.
    assert model_state_bytes(175e9, 1, ZeroStage.NONE, Convention.LECTURE).total / GB == pytest.approx(3500)


def test_13b_paper_vs_slides():
    # Lecture exercise 1: 16 x 13B = 208 GB (paper), 20 x 13B = 260 GB (slides).
    assert model_state_bytes(13e9, 1, ZeroStage.NONE).total / GB == pytest.approx(208)
    assert model_state_bytes(13e9, 1, ZeroStage.NONE, Convention.LECTURE).total / GB == pytest.approx(260)


@pytest.mark.parametrize(("stage", "expected_gb"), list(zip(STAGES, [208.0, 61.75, 37.375, 13.0])))
def test_13b_on_16_gpus(stage, expected_gb):
    # Lecture exercise 2: Psi = 13B, N_d = 16, K = 12.
    assert model_state_bytes(13e9, 16, stage).total / GB == pytest.approx(expected_gb, rel=1e-12)


@pytest.mark.parametrize("dp", [1, 8, 64, 1024, math.inf])
def test_v100_32gb_dp_limit_is_2b_for_any_nd(dp):
    # Lecture Sec. 2.6: plain data parallelism trains at most 2B on a 32 GB V100.
    assert largest_trainable_params(32 * GB, dp, ZeroStage.NONE) == pytest.approx(2e9)


def test_v100_32gb_zero1_zero2_approach_8b_and_16b():
    for stage, limit in ((ZeroStage.OPTIMIZER, 8e9), (ZeroStage.GRADIENTS, 16e9)):
        assert largest_trainable_params(32 * GB, math.inf, stage) == pytest.approx(limit)
        finite = [largest_trainable_params(32 * GB, n, stage) for n in (4, 64, 1024)]
        assert finite == sorted(finite) and finite[-1] < limit and finite[-1] > 0.98 * limit


def test_v100_32gb_zero3_exceeds_2t_at_1024_gpus():
    got = largest_trainable_params(32 * GB, 1024, ZeroStage.PARAMETERS)
    assert got > 2e12 and got == pytest.approx(2.048e12)
    assert math.isinf(largest_trainable_params(32 * GB, math.inf, ZeroStage.PARAMETERS))


def test_80gb_zero2_40b_and_zero3_1_28t_at_256():
    # Lecture exercise 5.
    assert largest_trainable_params(80 * GB, math.inf, ZeroStage.GRADIENTS) == pytest.approx(40e9)
    assert largest_trainable_params(80 * GB, 256, ZeroStage.PARAMETERS) == pytest.approx(1.28e12)


def test_fused_fp32_buffer_of_1_5b_model_is_6gb():
    # Lecture Sec. 1.4 / ZeRO paper Sec. 3.2.
    assert fused_flat_buffer_bytes(1.5e9) / GB == pytest.approx(6.0)
