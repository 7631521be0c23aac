"""Generated hostile input (hypothesis): arbitrary TOML and JSON documents, arbitrary bytes,
and random mutations of the bundled scenarios. Whatever the input, `zerosim` answers with
exit 0 or 3 (a result, strict JSON) or exit 2 (one line naming the file), never a
traceback. The engine's work budget is lowered here so that every example runs in well
under a second; the limit itself is what stops a hang (sim.core.limits)."""

from __future__ import annotations

import json
import math
import os
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.cli import main
from sim.core import limits
from tests.conftest import ROOT

SCENARIO_KEYS = ["model", "cluster", "nodes", "gpus_per_node", "engine", "deepspeed", "parallel", "training",
                 "zero", "fsdp", "ddp", "schedule", "comm", "tp", "pp", "dp", "seq_len", "micro_batch",
                 "global_batch", "grad_accum", "precision", "recompute", "stage", "offload_optimizer",
                 "reduce_bucket_size", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "experts",
                 "busbw_GBps", "forward_prefetch", "reshard_root", "broadcast_buffers", "device"]
HF_KEYS = ["model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
           "head_dim", "intermediate_size", "vocab_size", "tie_word_embeddings", "num_local_experts",
           "num_experts_per_tok", "n_embd", "n_layer", "n_head", "n_inner", "n_positions", "attention_bias"]
DS_KEYS = ["train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "bf16", "fp16",
           "enabled", "zero_optimization", "stage", "offload_optimizer", "device", "gradient_clipping",
           "activation_checkpointing", "partition_activations", "optimizer", "type", "communication_data_type"]
CATALOG = ["llama2-7b", "gpt2", "mixtral-8x7b", "dgx-a100-80g", "dgx-h100", "local-cpu", "cpu", "3", "bf16",
           "deepspeed", "fsdp2", "ddp", "llama", "gpt2", "mixtral", "full", "paper", "nvme"]

scalars = st.one_of(
    st.integers(-(2**70), 2**70), st.sampled_from([0, 1, 2, 8, -1, 10**9, 10**19, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
    st.sampled_from(CATALOG), st.text(max_size=12))


def values(keys: list[str]) -> st.SearchStrategy[Any]:
    names = st.one_of(st.sampled_from(keys), st.text(min_size=1, max_size=10))
    return st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                          st.dictionaries(names, inner, max_size=5)),
                        max_leaves=25)


def documents(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    names = st.one_of(st.sampled_from(keys), st.text(min_size=1, max_size=10))
    return st.dictionaries(names, values(keys), max_size=10)


def toml_text(doc: dict[str, Any]) -> str:
    """Top-level keys with inline values; quoted keys; TOML floats (inf, nan) as TOML writes them."""
    return "".join(f"{json.dumps(k)} = {_toml(v)}\n" for k, v in doc.items())


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return json.dumps(v)


def check_contract(argv: list[str], capsys) -> int:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code in (0, 2, 3), (code, err)
    assert "Traceback" not in err
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("zerosim: error: ") and not out, err
    else:
        json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in JSON output"))
    return code


@pytest.fixture
def small_budget(monkeypatch):
    monkeypatch.setattr(limits, "MAX_PLANNED_OPS", 20_000)
    monkeypatch.setattr(limits, "MAX_SIMULATED_OPS", 40_000)


# Deterministic in CI; ZEROSIM_HOSTILE_EXAMPLES=2000 explores further (docs/validation.md).
SETTINGS = settings(max_examples=int(os.environ.get("ZEROSIM_HOSTILE_EXAMPLES", "60")), deadline=None,
                    derandomize="ZEROSIM_HOSTILE_EXAMPLES" not in os.environ,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(doc=documents(SCENARIO_KEYS), command=st.sampled_from(["memory", "run"]))
def test_arbitrary_toml_scenarios(tmp_path, capsys, small_budget, doc, command):
    path = tmp_path / "s.toml"
    path.write_text(toml_text(doc), encoding="utf-8", errors="surrogatepass")
    check_contract([command, str(path), "--json"], capsys)


@SETTINGS
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes(tmp_path, capsys, data):
    path = tmp_path / "s.toml"
    path.write_bytes(data)
    check_contract(["memory", str(path), "--json"], capsys)


BASE = (ROOT / "scenarios" / "llama3-8b_fsdp2_dgx-h100x1.toml").read_text()


@SETTINGS
@given(hf=documents(HF_KEYS), model_type=st.sampled_from(["llama", "gpt2", "mixtral", "qwen2", "bert", None]))
def test_arbitrary_hf_configs(tmp_path, capsys, small_budget, hf, model_type):
    if model_type is not None:
        hf["model_type"] = model_type
    (tmp_path / "config.json").write_text(json.dumps(hf))
    scenario = tmp_path / "s.toml"
    scenario.write_text(BASE.replace('model = "llama3-8b"', 'model = "config.json"'))
    check_contract(["memory", str(scenario), "--json"], capsys)


@SETTINGS
@given(ds=documents(DS_KEYS))
def test_arbitrary_ds_configs(tmp_path, capsys, ds):
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    scenario = tmp_path / "s.toml"
    scenario.write_text(BASE.split("[fsdp]")[0].replace("nodes = 1", 'nodes = 1\ndeepspeed = "ds.json"'))
    check_contract(["memory", str(scenario), "--json"], capsys)


BUNDLED = sorted((ROOT / "scenarios").glob("*.toml"))


def paths(doc: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for key, value in doc.items():
        out.append((*prefix, key))
        if isinstance(value, dict):
            out += paths(value, (*prefix, key))
    return out


@st.composite
def mutations(draw: st.DrawFn) -> tuple[Path, dict[str, Any]]:
    """A bundled scenario with one key deleted, replaced by a random value, or added."""
    path = draw(st.sampled_from(BUNDLED))
    doc = tomllib.loads(path.read_text())
    where = draw(st.sampled_from(paths(doc)))
    parent = doc
    for key in where[:-1]:
        parent = parent[key]
    action = draw(st.sampled_from(["delete", "replace", "add"]))
    if action == "delete":
        del parent[where[-1]]
    elif action == "replace":
        parent[where[-1]] = draw(values(SCENARIO_KEYS))
    else:
        parent[draw(st.sampled_from(SCENARIO_KEYS))] = draw(values(SCENARIO_KEYS))
    return path, doc


@SETTINGS
@given(mutated=mutations(), command=st.sampled_from(["memory", "run"]))
def test_mutated_bundled_scenarios(tmp_path, capsys, small_budget, mutated, command):
    source, doc = mutated
    target = tmp_path / source.name
    target.write_text(toml_text(doc), encoding="utf-8", errors="surrogatepass")
    for side in source.parent.glob("*.json"):      # a referenced ds_config
        (tmp_path / side.name).write_text(side.read_text())
    check_contract([command, str(target), "--json"], capsys)
