"""Exact parameter counts (HF num_parameters()) and the papers' FLOP formulas."""

from __future__ import annotations

import pytest

from sim.analytic.compute import korthikanti_model_flops, megatron_flops_per_iteration
from sim.analytic.params import active_params, gpt_params_megatron, total_params
from sim.core.model import module_tree
from sim.inputs.catalog import catalog_names
from tests.conftest import catalog_model

HF_COUNTS = {  # Hugging Face model.num_parameters()
    "llama2-7b": 6_738_415_616, "llama2-13b": 13_015_864_320, "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248, "llama3-70b": 70_553_706_496, "llama3-405b": 405_853_388_800,
    "mistral-7b": 7_241_732_096, "mixtral-8x7b": 46_702_792_704, "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168, "gpt2-large": 774_030_080, "gpt2-xl": 1_557_611_200,
    "qwen2-7b": 7_615_616_512, "llama-2-7b-hf": 6_738_415_616, "gpt2-hf": 124_439_808,
    "mixtral-8x7b-v0.1": 46_702_792_704,
}


@pytest.mark.parametrize(("name", "count"), HF_COUNTS.items())
def test_exact_parameter_counts(name, count):
    assert total_params(catalog_model(name)) == count


def test_mixtral_active_parameters():
    assert active_params(catalog_model("mixtral-8x7b")) == 12_879_925_248


@pytest.mark.parametrize("name", catalog_names("models"))
def test_module_tree_matches_closed_form(name):
    m = catalog_model(name)
    assert sum(mod.numel for mod in module_tree(m)) == total_params(m)


def test_module_tree_of_llama2_7b():
    mods = module_tree(catalog_model("llama2-7b"))
    # embedding, 32 x (2 norms + q k v o + gate up down), final norm, lm_head
    assert len(mods) == 1 + 32 * 9 + 2
    assert mods[1].name == "model.layers.0.input_layernorm" and mods[-1].name == "lm_head"
    assert {m.block for m in mods if m.block is not None} == set(range(32))


def test_gpt2_conv1d_weights_are_in_by_out():
    mods = {m.name: m for m in module_tree(catalog_model("gpt2"))}
    assert mods["model.layers.0.attn.c_attn"].tensors[0].shape == (768, 2304)


def test_gpt3_megatron_eq2_174_6b():
    # Megatron SC21 Eq. 2 with its padded vocabulary V = 51200, s = 2048.
    assert gpt_params_megatron(96, 12288, 51200, 2048) / 1e9 == pytest.approx(174.6, abs=0.05)
    assert total_params(catalog_model("gpt3-175b")) / 1e9 == pytest.approx(174.6, abs=0.05)


def test_megatron_eq3_reproduces_mt_nlg_and_bloom():
    # shared/validation/README.md Sec. 3: MT-NLG 60.1 s on 2240 GPUs -> 125.7 TFLOP/s;
    # BLOOM 105.22 s on 384 GPUs -> 149.0 TFLOP/s.
    mtnlg = megatron_flops_per_iteration(1920, 2048, 105, 20480, 50272) / (60.1 * 2240) / 1e12
    bloom = megatron_flops_per_iteration(2048, 2048, 70, 14336, 250880) / (105.22 * 384) / 1e12
    assert mtnlg == pytest.approx(125.7, abs=0.05)
    assert bloom == pytest.approx(149.0, abs=0.05)


def test_korthikanti_model_flops_is_three_quarters_of_megatron_for_large_models():
    ratio = korthikanti_model_flops(1, 2048, 96, 12288, 51200) / megatron_flops_per_iteration(
        1, 2048, 96, 12288, 51200)
    assert 0.74 < ratio < 0.76
