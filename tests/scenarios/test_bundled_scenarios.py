"""Every bundled scenario loads, states its question, and gives a memory answer."""

from __future__ import annotations

import json

import pytest

from sim.cli import main
from sim.core.enums import Engine, ZeroStage
from sim.inputs.load import load_scenario
from tests.conftest import SCENARIOS

BUNDLED = sorted(SCENARIOS.glob("*.toml"))


def test_at_least_six_scenarios():
    assert len(BUNDLED) >= 6


@pytest.mark.parametrize("path", BUNDLED, ids=lambda p: p.stem)
def test_scenario_loads_and_asks_a_question(path):
    s = load_scenario(path)
    assert s.question.endswith("?") or "?" in s.question, "a scenario opens with the question it answers"
    assert s.parallel.world_size == s.world_size
    assert s.training.global_batch == s.training.micro_batch * s.training.grad_accum * s.parallel.dp


@pytest.mark.parametrize("path", BUNDLED, ids=lambda p: p.stem)
def test_memory_json_for_every_scenario(path, capsys):
    code = main(["memory", str(path), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == (0 if report["fits"] else 3)
    own = report["rows"][report["this_stage"]]
    assert own["total_bytes"] == pytest.approx(sum(own[k] for k in (
        "params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "buffers_bytes",
        "fragmentation_bytes")))


def test_llama2_13b_needs_zero3_on_a100_40gb(capsys):
    code = main(["memory", str(SCENARIOS / "llama2-13b_zero2_dgx-a100-40gx1.toml"), "--json"])
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert code == 3 and not rows[2]["fits"] and rows[3]["fits"]


def test_ds_config_scenario_fills_hf_auto_and_batch():
    s = load_scenario(SCENARIOS / "mistral-7b_ds-config_dgx-a100-80gx1.toml")
    assert s.engine is Engine.DEEPSPEED and s.zero.stage == ZeroStage.GRADIENTS
    assert s.zero.reduce_bucket_size == 4096**2 and s.zero.overlap_comm
    assert (s.training.micro_batch, s.training.grad_accum, s.training.global_batch) == (2, 4, 64)
    assert s.training.precision == "bf16"


def test_offload_moves_optimizer_states_to_the_host(capsys):
    main(["memory", str(SCENARIOS / "llama2-70b_zero3-offload_dgx-h100x4.toml"), "--json"])
    z3 = json.loads(capsys.readouterr().out)["rows"][3]
    psi = 68_976_648_192
    # pinned fp32 master, Adam m and v and the fp32 gradient partition (16 B), plus the 16-bit gradient
    # partition buffer stage3.py keeps on the host when the optimizer is offloaded (2 B): 18 B per parameter
    assert z3["optimizer_bytes"] == 0 and z3["host_bytes"] == pytest.approx(18 * psi / 32, rel=1e-6)


def test_fragmentation_allowance_raises_the_total(capsys):
    path = str(SCENARIOS / "llama2-7b_zero3_dgx-a100-80gx2.toml")
    main(["memory", path, "--json"])
    plain = json.loads(capsys.readouterr().out)["rows"][3]
    main(["memory", path, "--json", "--fragmentation", "0.1"])
    frag = json.loads(capsys.readouterr().out)["rows"][3]
    assert frag["fragmentation_bytes"] == pytest.approx(0.1 * (plain["activations_bytes"] + plain["buffers_bytes"]))
    assert frag["total_bytes"] > plain["total_bytes"]


def test_quick_question_text(capsys):
    assert main(["memory", "--params", "7.5e9", "--dp", "64", "--gpu-memory", "32GB"]) == 0
    text = capsys.readouterr().out
    assert "ZeRO-3" in text and "120.00" in text and "1.88" in text
    assert "ZeRO-1 8.0B, ZeRO-2 16.0B, ZeRO-3 unbounded" in text


def test_bundled_scenario_by_name(capsys):
    assert main(["memory", "llama3-8b_fsdp2_dgx-h100x1"]) == 0
    assert "engine fsdp2" in capsys.readouterr().out


def test_fsdp2_row_counts_what_fsdp2_allocates_and_agrees_with_the_des(capsys):
    from sim.inputs.load import load_scenario
    from sim.simulate import simulate
    path = SCENARIOS / "llama3-8b_fsdp2_dgx-h100x1.toml"
    main(["memory", str(path), "--json"])
    own = json.loads(capsys.readouterr().out)["rows"][3]
    psi = 8_030_261_248
    assert own["params_bytes"] == pytest.approx(4 * psi / 8) and own["optimizer_bytes"] == pytest.approx(8 * psi / 8)
    des = simulate(load_scenario(path)).engine.schedule.classes[0].resident
    resident = {a.category.value: 0.0 for a in des}
    for a in des:
        resident[a.category.value] += a.nbytes
    assert resident["optimizer"] == pytest.approx(own["optimizer_bytes"], rel=1e-4)   # dim-0 padding
    assert resident["grads"] == pytest.approx(own["grads_bytes"], rel=1e-4)
