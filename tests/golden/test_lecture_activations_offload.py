"""Golden numbers for activations, partitioned checkpoints (P_a), offload, LoRA, ZeRO++
and communication volume (shared/reference/000_*.txt Secs. 1.3, 3.1, 4.2-4.5, 5.4)."""

from __future__ import annotations

import pytest

from sim.analytic.activations import (
    checkpoint_bytes,
    korthikanti_layer_bytes,
    layer_activation_bytes,
    pa_allgather_bytes_per_layer,
    zero_paper_activation_bytes,
)
from sim.analytic.comm import zero_volume_deepspeed, zero_volume_paper
from sim.analytic.lora import lora_model_state_bytes, lora_trainable_params
from sim.analytic.offload import offload_step_time, offload_transfer_bytes, tokens_to_hide_offload
from sim.analytic.params import total_params
from sim.analytic.zeropp import zero3_cross_node_volume, zeropp_cross_node_volume
from sim.core.enums import ZeroStage
from tests.conftest import catalog_model

GB, GiB, MiB = 1e9, 2**30, 2**20


def test_gpt2_xl_activations_korthikanti_287gb():
    # Sec. 1.3: 48 layers, h 1600, 25 heads, seq 1024, batch 32 -> 287 GB (5as/h = 80 >> 34).
    per_layer = korthikanti_layer_bytes(1024, 32, 1600, 25)
    assert 48 * per_layer / GB == pytest.approx(287, abs=0.5)
    # the saved-tensor count of the catalog model gives exactly the same number
    m = catalog_model("gpt2-xl")
    assert layer_activation_bytes(m, 1024, 32) == pytest.approx(per_layer, rel=1e-12)


def test_gpt2_xl_activations_zero_paper_about_60gb():
    assert zero_paper_activation_bytes(48, 1600, 1024, 32) / GB == pytest.approx(60, abs=0.5)


def test_partitioned_checkpoints_100b():
    # Sec. 4.2: 125 layers, h 8192, seq 1024, batch 32: 62.5 GiB, 3.9 GiB at t = 16, 512 MiB/layer.
    assert checkpoint_bytes(125, 1024, 32, 8192) / GiB == pytest.approx(62.5)
    assert checkpoint_bytes(125, 1024, 32, 8192, tp=16, partitioned=True) / GiB == pytest.approx(3.9, abs=0.01)
    assert pa_allgather_bytes_per_layer(1024, 32, 8192) / MiB == pytest.approx(512)


def test_partitioned_checkpoints_80_layers_t8():
    # Exercise 8: 80 layers x 512 MiB = 40 GiB unpartitioned, 5 GiB with P_a at t = 8.
    assert checkpoint_bytes(80, 1024, 32, 8192) / GiB == pytest.approx(40)
    assert checkpoint_bytes(80, 1024, 32, 8192, tp=8, partitioned=True) / GiB == pytest.approx(5)


def test_offload_tokens_to_hide_about_17k():
    # Sec. 4.4: CPU-Adam 1.5 G params/s + PCIe 25 GB/s vs an A100 at 40% MFU -> ~17K tokens.
    tokens = tokens_to_hide_offload(cpu_adam_params_per_s=1.5e9, pcie_bandwidth=25e9,
                                    peak_flops=312e12, mfu=0.4)
    assert round(tokens, -3) == 17_000


def test_offload_7b_pcie_28gb_1_12s():
    # Exercise 9: 4 Psi = 28 GB per step, 1.12 s at 25 GB/s; CPU-Adam at 1.5 G/s ~ 4.7 s.
    assert offload_transfer_bytes(7e9) / GB == pytest.approx(28)
    t = offload_step_time(7e9, pcie_bandwidth=25e9, cpu_adam_params_per_s=1.5e9)
    assert t.d2h + t.h2d == pytest.approx(1.12)
    assert t.cpu_adam == pytest.approx(4.67, abs=0.01)


def test_lora_llama2_13b_r16_qkvo_26_2m():
    # Exercise 12: 16 x (5120 + 5120) x 4 projections x 40 layers = 26.2M.
    assert lora_trainable_params(catalog_model("llama2-13b"), 16, "qkvo") == 26_214_400


def test_lora_llama2_7b_zero2_frozen_base_13_5gb():
    # Sec. 5.4: LoRA trains 0.06% of Llama-2-7B (r 8 on q, v); under ZeRO-2 on 4 GPUs the
    # frozen fp16 base alone is 13.5 GB per GPU.
    m = catalog_model("llama2-7b")
    trainable = lora_trainable_params(m, 8, ("q", "v"))
    assert 100 * trainable / total_params(m) == pytest.approx(0.06, abs=0.005)
    states = lora_model_state_bytes(m, 8, ("q", "v"), 4, ZeroStage.GRADIENTS)
    assert states.total / GB == pytest.approx(13.5, abs=0.05)
    assert 2 * total_params(m) / GB == pytest.approx(13.5, abs=0.05)


def test_zeropp_cuts_cross_node_volume_to_a_quarter():
    # Sec. 4.5: 3M -> 0.5M (qwZ) + 0 (hpZ) + 0.25M (qgZ) = M/4 of the original, plus scales.
    base = zero3_cross_node_volume(1e9).total
    zpp = zeropp_cross_node_volume(1e9)
    assert zpp.total / base == pytest.approx(0.25, abs=0.005)
    assert zpp.backward_all_gather == 0


@pytest.mark.parametrize("dp", [2, 4, 64])
def test_paper_volumes_2psi_and_3psi(dp):
    # Sec. 3.1: DP, ZeRO-1, ZeRO-2 move 2 Psi, ZeRO-3 3 Psi, times (N-1)/N (elements).
    psi, f = 1e9, (dp - 1) / dp
    got = [zero_volume_paper(psi, dp, s, bytes_per_element=1).total for s in ZeroStage]
    assert got == pytest.approx([2 * psi * f, 2 * psi * f, 2 * psi * f, 3 * psi * f], rel=1e-12)


def test_deepspeed_zero12_moves_3psi_not_2psi():
    # reference 1.3: bucketed all-reduce (2 Psi) + post-step all-gather (Psi).
    psi, dp = 1e9, 8
    for stage in (ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS):
        v = zero_volume_deepspeed(psi, dp, stage, bytes_per_element=1)
        assert v.total == pytest.approx(3 * psi * (dp - 1) / dp)
    z2 = zero_volume_deepspeed(psi, dp, ZeroStage.GRADIENTS, grad_accum=4, bytes_per_element=1)
    z1 = zero_volume_deepspeed(psi, dp, ZeroStage.OPTIMIZER, grad_accum=4, bytes_per_element=1)
    assert z2.all_reduce == pytest.approx(4 * z1.all_reduce)
