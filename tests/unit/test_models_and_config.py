"""Model files vs HF config.json, DeepSpeed config defaults and DeepSpeed's batch rule."""

from __future__ import annotations

import json

import pytest

from sim.analytic.params import total_params
from sim.analytic.placement import params_per_stage
from sim.core.enums import OffloadDevice, ZeroStage
from sim.core.errors import InputError
from sim.core.model import Bias
from sim.inputs.deepspeed_config import read_deepspeed_config, resolve_batch
from sim.inputs.hf_config import model_from_hf_config
from sim.inputs.zero_config import zero_from_dict
from tests.conftest import catalog_model


def test_hf_config_gives_the_same_model_as_the_toml():
    for toml, hf in (("llama2-7b", "llama-2-7b-hf"), ("gpt2", "gpt2-hf"), ("mixtral-8x7b", "mixtral-8x7b-v0.1")):
        a, b = catalog_model(toml), catalog_model(hf)
        assert (a.layers, a.hidden, a.heads, a.kv_heads, a.ffn_hidden, a.vocab, a.tied_embeddings,
                a.experts, a.bias) == (b.layers, b.hidden, b.heads, b.kv_heads, b.ffn_hidden, b.vocab,
                                       b.tied_embeddings, b.experts, b.bias)


def test_qwen2_has_qkv_bias_and_gqa():
    m = catalog_model("qwen2-7b")
    assert m.bias is Bias.QKV and m.kv_heads == 4 and m.head_dim == 128


def test_hf_unsupported_model_type_is_an_input_error():
    with pytest.raises(InputError, match="allowed: llama, mistral, qwen2, gpt2, mixtral"):
        model_from_hf_config({"model_type": "bert"}, "config.json")
    with pytest.raises(InputError, match="num_hidden_layers"):
        model_from_hf_config({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
                              "intermediate_size": 128, "vocab_size": 100}, "config.json")


def test_placement_splits_layers_and_puts_embeddings_at_the_ends():
    m = catalog_model("llama2-7b")
    assert sum(params_per_stage(m, 1, 1)) == total_params(m)
    stages = params_per_stage(m, 2, 4)
    assert stages[0] > stages[1] == stages[2] < stages[3]


def test_zero_code_defaults_not_doc_defaults():
    # deepspeed/runtime/zero/config.py: overlap_comm None -> stage == 3; prefetch 5e7 (docs 5e8).
    z2, z3 = (zero_from_dict({"stage": s}, "x.json", "zero.", hidden=4096) for s in (2, 3))
    assert z2.overlap_comm is False and z3.overlap_comm is True
    assert z3.prefetch_bucket_size == 50_000_000 and z3.reduce_bucket_size == 500_000_000
    assert z3.offload_optimizer.device is OffloadDevice.NONE and z3.offload_optimizer.pin_memory


def test_zero_aliases_auto_and_offload_forms():
    z = zero_from_dict({"stage": 3, "stage3_prefetch_bucket_size": "auto", "reduce_bucket_size": "auto",
                        "stage3_param_persistence_threshold": "auto", "offload_optimizer": "cpu",
                        "offload_param": {"device": "cpu", "pin_memory": True}}, "x.json", "", hidden=4096)
    assert z.reduce_bucket_size == 4096**2 and z.prefetch_bucket_size == int(0.9 * 4096**2)
    assert z.param_persistence_threshold == 40960
    assert z.offload_optimizer.device is OffloadDevice.CPU and z.offload_param.pin_memory


@pytest.mark.parametrize(("raw", "key"), [
    ({"stage": 2, "offload_param": "cpu"}, "offload_param"),
    ({"stage": 2, "zero_quantized_weights": True}, "zero_quantized_weights"),
    ({"stage": 3, "reduce_bucket_sise": 5}, "reduce_bucket_sise"),
    ({"stage": 3, "mics_shard_size": 8}, "mics_shard_size"),
    ({"stage": 3, "allgather_bucket_size": "auto"}, "allgather_bucket_size"),
    ({"stage": 1, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}, "offload_optimizer.ratio"),
])
def test_zero_config_errors(raw, key):
    with pytest.raises(InputError) as e:
        zero_from_dict(raw, "x.json", "zero_optimization.", hidden=4096)
    assert e.value.key == f"zero_optimization.{key}"


@pytest.mark.parametrize(("given", "expected"), [
    ((64, 2, 4), (64, 2, 4)), ((64, 2, None), (64, 2, 4)), ((64, None, 4), (64, 2, 4)),
    ((None, 2, 4), (64, 2, 4)), ((64, None, None), (64, 8, 1)), ((None, 2, None), (16, 2, 1)),
])
def test_deepspeed_batch_fill_rules(given, expected):
    keys = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    assert resolve_batch(*given, 8, tuple(("ds.json", k) for k in keys)) == expected


@pytest.mark.parametrize("given", [(100, 1, 8), (None, None, 4), (4, 1, None)])
def test_deepspeed_batch_rule_failures(given):
    keys = ("global_batch", "micro_batch", "grad_accum")
    with pytest.raises(InputError):
        resolve_batch(*given, 8, tuple(("s.toml", k) for k in keys))


def test_ds_config_json(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"bf16": {"enabled": True}, "train_batch_size": 32,
                                "zero_optimization": {"stage": 3}, "steps_per_print": 10}))
    ds = read_deepspeed_config(path, hidden=1024)
    assert ds.precision == "bf16" and ds.gradient_clipping == 1.0 and ds.zero.stage == ZeroStage.PARAMETERS
    path.write_text(json.dumps({"bf16": {"enabled": True}, "fp16": {"enabled": True}}))
    with pytest.raises(InputError, match="cannot both be enabled"):
        read_deepspeed_config(path, hidden=1024)
    path.write_text(json.dumps({"train_batch_size": 32, "zero_optimisation": {}}))
    with pytest.raises(InputError, match="zero_optimisation"):
        read_deepspeed_config(path, hidden=1024)
    path.write_text(json.dumps({"optimizer": {"type": "SGD"}}))
    with pytest.raises(InputError, match="optimizer.type"):
        read_deepspeed_config(path, hidden=1024)
