"""DeepSpeed's own estimators, a convention separate from the paper's K = 12.

deepspeed/runtime/zero/stage_1_and_2.py `estimate_zero2_model_states_mem_needs`:
GPU = 2 Psi + int(18 Psi / N) without offload, 2 Psi with CPU offload.
deepspeed/runtime/zero/stage3.py `estimate_zero3_model_states_mem_needs`:
GPU = 4 L + int(18 Psi / N); 4 L + int(2 Psi / N) with optimizer offload; 4 L with both.
"""

from __future__ import annotations

import pytest

from sim.analytic.memory import model_state_bytes
from sim.analytic.params import largest_module_params, total_params
from sim.core.enums import Convention, ZeroStage
from tests.conftest import catalog_model

DS = Convention.DEEPSPEED


@pytest.mark.parametrize("gpus", [1, 8, 64])
def test_zero2_estimator(gpus):
    psi = 6_738_415_616
    assert model_state_bytes(psi, gpus, ZeroStage.GRADIENTS, DS).total == pytest.approx(
        2 * psi + int(18 * psi / gpus), abs=1)
    assert model_state_bytes(psi, gpus, ZeroStage.GRADIENTS, DS, offload_optimizer=True).total == 2 * psi


@pytest.mark.parametrize("gpus", [8, 256])
def test_zero3_estimator_with_largest_layer(gpus):
    m = catalog_model("llama2-7b")
    psi, largest = total_params(m), largest_module_params(m)
    assert largest == 32000 * 4096  # embedding and lm_head are the largest modules
    s = ZeroStage.PARAMETERS
    assert model_state_bytes(psi, gpus, s, DS, largest_module_params=largest).total == pytest.approx(
        4 * largest + int(18 * psi / gpus), abs=1)
    assert model_state_bytes(psi, gpus, s, DS, largest_module_params=largest,
                             offload_optimizer=True).total == pytest.approx(4 * largest + int(2 * psi / gpus), abs=1)
    assert model_state_bytes(psi, gpus, s, DS, largest_module_params=largest, offload_optimizer=True,
                             offload_params=True).total == pytest.approx(4 * largest)


def test_deepspeed_stage0_is_the_20_byte_accounting():
    assert model_state_bytes(1e9, 8, ZeroStage.NONE, DS).total == 20e9


def test_allocated_counts_the_whole_fp32_gradient_the_stage3_estimator_leaves_out():
    psi, gpus, largest = 1e9, 8, 1e8
    ds = model_state_bytes(psi, gpus, ZeroStage.PARAMETERS, DS, largest_module_params=largest)
    alloc = model_state_bytes(psi, gpus, ZeroStage.PARAMETERS, Convention.ALLOCATED,
                              largest_module_params=largest)
    assert alloc.total - ds.total == pytest.approx(2 * psi / gpus)
    for stage in (ZeroStage.NONE, ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS):
        assert model_state_bytes(psi, gpus, stage, DS).total == model_state_bytes(
            psi, gpus, stage, Convention.ALLOCATED).total
