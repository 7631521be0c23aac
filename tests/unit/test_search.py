"""`zerosim search`: every candidate layout ends ranked or rejected with its reason; the
analytic lower bound never exceeds the simulated step; pruning only drops layouts whose
bound cannot enter the ranking."""

from __future__ import annotations

import json

import pytest

from sim.cli import main
from sim.inputs.models import model_from_table
from sim.studies.search import candidates, search

SCENARIO = """
# Which layout trains this small model fastest on two DGX A100 nodes?
model = { name = "small", layers = 8, hidden = 2048, heads = 16, kv_heads = 16, ffn_hidden = 5504, vocab = 32000 }
cluster = "dgx-a100-80g"
nodes = 2
[training]
seq_len = 2048
global_batch = 64
micro_batch = 1
precision = "bf16"
[zero]
stage = 1
"""


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    path = tmp_path_factory.mktemp("search") / "small.toml"
    path.write_text(SCENARIO)
    return path, *search(path, top=3, max_simulations=8)


def test_every_candidate_is_ranked_or_rejected_with_a_reason(searched):
    path, ranked, rejected = searched
    m = model_from_table({"name": "small", "layers": 8, "hidden": 2048, "heads": 16, "kv_heads": 16,
                          "ffn_hidden": 5504, "vocab": 32000}, "x", "model.")
    assert len(ranked) + len(rejected) == len(candidates(m, 16, 8, 64)) > 100
    assert (rejected["reason"].str.len() > 0).all()
    kinds = {r.split(":")[0] for r in rejected["reason"]}
    assert kinds <= {"invalid", "does not fit (memory estimate)", "does not fit (simulated)", "pruned",
                     "not simulated"}
    assert list(ranked["rank"]) == list(range(1, len(ranked) + 1))
    assert list(ranked["step_time_s"]) == sorted(ranked["step_time_s"])
    assert ranked["fits"].all() and len(ranked) >= 3


def test_the_bound_is_a_lower_bound_and_pruning_keeps_the_best(searched):
    _, ranked, rejected = searched
    assert (ranked["bound_s"] <= ranked["step_time_s"] * (1 + 1e-9)).all()
    fourth = sorted(ranked["step_time_s"])[2]
    pruned = rejected[rejected["reason"].str.startswith("pruned")]
    assert (pruned["bound_s"] >= fourth * (1 - 1e-9)).all()
    assert len(pruned) > 0


def test_the_command_prints_the_ranking_and_json(searched, capsys, tmp_path):
    path, ranked, _ = searched
    out = tmp_path / "all.csv"
    assert main(["search", str(path), "--top", "2", "--max-simulations", "3", "--json", "--quiet",
                 "--csv", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["ranked"]) == 2 and all(r["reason"] for r in data["rejected"])
    assert data["ranked"][0]["step_time_s"] <= data["ranked"][-1]["step_time_s"]
    assert out.read_text().count("\n") > 100
    bad = tmp_path / "bad.toml"
    bad.write_text(SCENARIO.replace("global_batch = 64\n", ""))
    assert main(["search", str(bad), "--quiet"]) == 2
    assert "training.global_batch" in capsys.readouterr().err
    assert main(["search", str(path), "--strategies", "megatron,warp"]) == 2


def test_pipelines_that_do_not_divide_the_layers_put_a_block_less_on_each_end(tmp_path):
    """126 layers on 16 stages (Llama 3.1 405B) only as 7 + 14 x 8 + 7; a 10-layer model on
    4 stages as 2 + 3 + 3 + 2, simulated like any other candidate, its bound below its step."""
    from sim.inputs.load import scenario_from_table
    from sim.inputs.reading import parse_toml
    from sim.simulate import simulate
    from sim.studies.search import lower_bound, pipeline_splits, table_of

    assert (16, 7) in pipeline_splits(126, 64) and (16, 0) not in pipeline_splits(126, 64)
    assert pipeline_splits(8, 64) == [(1, 0), (2, 0), (4, 0), (5, 1), (8, 0)]     # 1 + 3 x 2 + 1 on 5
    text = SCENARIO.replace("layers = 8", "layers = 10")
    m = model_from_table({"name": "small", "layers": 10, "hidden": 2048, "heads": 16, "kv_heads": 16,
                          "ffn_hidden": 5504, "vocab": 32000}, "x", "model.")
    uneven = [k for k in candidates(m, 16, 8, 64) if k["end_stage_layers"]]
    assert uneven and {(k["pp"], k["end_stage_layers"]) for k in uneven} == {(4, 2)}
    assert all(k["virtual_stages"] == 1 and k["strategy"] in ("megatron", "deepspeed z1", "fsdp2") for k in uneven)
    keys = next(k for k in uneven if k["strategy"] == "megatron" and k["tp"] == 1 and k["micro_batch"] == 1
                and k["recompute"] == "none")
    s = scenario_from_table(table_of(parse_toml(text, tmp_path / "s.toml"), keys), tmp_path / "s.toml", "s")
    assert s.stages.counts() == (2, 3, 3, 2)
    assert lower_bound(s) <= simulate(s).step_time_s


def test_zero3_layouts_run_the_deepspeed_release_asked_for(tmp_path, capsys):
    """`--deepspeed-version 0.5` (or the scenario's `[zero] deepspeed_version`) makes the
    "deepspeed z3" layouts run DeepSpeed's 2021 ZeRO-3 (per-parameter synchronous gathers),
    slower than today's on the same layout; offload layouts, not simulated on that engine,
    are rejected with the loader's reason; an unknown release exits 2."""
    path = tmp_path / "small.toml"
    path.write_text(SCENARIO)
    only = dict(top=2, max_simulations=4, strategies=("deepspeed z3", "deepspeed z3+offload"), recompute=("full",))
    now, _ = search(path, **only)
    then, rejected = search(path, deepspeed_version="0.5", **only)
    same = ["tp", "micro_batch"]
    merged = now[now["strategy"] == "deepspeed z3"].merge(then, on=same, suffixes=("_now", "_then"))
    assert len(merged) and (merged["step_time_s_then"] > merged["step_time_s_now"]).all()
    offload = rejected[rejected["strategy"] == "deepspeed z3+offload"]
    assert len(offload) and offload["reason"].str.startswith("invalid: '0.5' with offload_optimizer").all()
    path.write_text(SCENARIO.replace("stage = 1", 'stage = 1\ndeepspeed_version = "0.5"'))
    from_file, _ = search(path, **only)
    assert list(from_file["step_time_s"]) == list(then["step_time_s"])
    assert main(["search", str(path), "--deepspeed-version", "0.7", "--quiet"]) == 2
    assert "0.5" in capsys.readouterr().err
