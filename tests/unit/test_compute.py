"""FLOP accounting: per-layer GEMMs + attention add up to the 6N + 12 L a d s rule."""

from __future__ import annotations

import pytest

from sim.analytic.compute import layer_flops, mfu, model_flops_per_token, step_flops
from sim.analytic.params import embedding_params, norm_params
from sim.core.enums import Recompute
from tests.conftest import catalog_model


@pytest.mark.parametrize("name", ["llama2-7b", "gpt2-xl", "mixtral-8x7b"])
def test_layers_plus_head_equal_6n_plus_attention(name):
    m = catalog_model(name)
    s, b = 2048, 2
    per_layer = layer_flops(m, s, b)
    gemms_and_attention = m.layers * (per_layer.forward + per_layer.backward) / (s * b)
    head_gemm = 6 * m.vocab * m.hidden  # the lm_head (or the tied embedding used as one)
    # parameters that are no GEMM: the embedding lookup (unless it is the tied head) and norms
    lookup = embedding_params(m) - (m.vocab * m.hidden if m.tied_embeddings else 0)
    not_gemm = 6 * (lookup + (2 * m.layers + 1) * norm_params(m))
    assert gemms_and_attention + head_gemm + not_gemm == pytest.approx(model_flops_per_token(m, s), rel=1e-12)


def test_backward_is_twice_forward_for_gemms():
    f = layer_flops(catalog_model("llama2-7b"), 4096, 1)
    gemm_forward = f.forward - f.attention_core_forward
    assert f.backward_weight == pytest.approx(gemm_forward)
    assert f.backward == pytest.approx(2 * f.forward)


def test_recompute_adds_hardware_flops_only():
    m = catalog_model("llama2-7b")
    none = step_flops(m, 4096, 8)
    full = step_flops(m, 4096, 8, recompute=Recompute.FULL)
    sel = step_flops(m, 4096, 8, recompute=Recompute.SELECTIVE)
    assert none[0] == none[1] == full[0] == sel[0]
    assert full[1] == pytest.approx(none[1] + 8 * m.layers * layer_flops(m, 4096, 1).forward)
    assert none[1] < sel[1] < full[1]


def test_causal_halves_the_attention_term():
    m = catalog_model("llama2-7b")
    full, causal = model_flops_per_token(m, 4096), model_flops_per_token(m, 4096, causal=True)
    assert full - causal == pytest.approx(6 * m.layers * m.heads * m.head_dim * 4096)


def test_mfu_definition():
    assert mfu(312e12 * 0.5 * 10 * 8, 10.0, 8, 312e12) == pytest.approx(0.5)
