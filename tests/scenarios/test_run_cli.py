"""`zerosim run` and `zerosim check`: the results contract, traces, exit codes."""

from __future__ import annotations

import json

import pytest

from sim.cli import main
from tests.conftest import SCENARIOS

CONTRACT = {"scenario": str, "fits": bool, "step_time_s": float, "tokens_per_s": float,
            "tflops_per_gpu": float, "hw_tflops_per_gpu": float, "mfu": float, "time": dict,
            "memory": dict, "comm": list}
TINY = """\
# How long is a step of a tiny model under ZeRO-3 on one DGX A100?
cluster = "dgx-a100-80g"
nodes = 1
[model]
layers = 2
hidden = 256
heads = 4
kv_heads = 4
ffn_hidden = 688
vocab = 1000
[training]
seq_len = 256
micro_batch = 2
grad_accum = 2
precision = "bf16"
[zero]
stage = 3
"""


def run_json(args, capsys):
    code = main(["run", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_run_json_follows_the_results_contract(write_scenario, capsys):
    code, out = run_json([str(write_scenario(TINY))], capsys)
    assert code == 0 and out["fits"] is True
    for key, kind in CONTRACT.items():
        assert isinstance(out[key], kind), key
    assert set(out["time"]) >= {"compute_s", "exposed_comm_s", "exposed_offload_s", "bubble_s", "optimizer_s"}
    assert set(out["memory"]) >= {"peak_bytes", "params_bytes", "grads_bytes", "optimizer_bytes",
                                  "activations_bytes", "buffers_bytes"}
    assert sum(out["time"].values()) == pytest.approx(out["step_time_s"], rel=1e-9)
    assert {c["op"] for c in out["comm"]} == {"all_gather", "reduce_scatter", "all_reduce"}


def test_run_exits_3_with_the_numbers_when_it_does_not_fit(capsys):
    code, out = run_json([str(SCENARIOS / "llama2-13b_zero2_dgx-a100-40gx1.toml")], capsys)
    assert code == 3 and out["fits"] is False
    oom = out["memory"]["out_of_memory"]
    assert oom["in_use_bytes"] > oom["capacity_bytes"] and out["memory"]["peak_bytes"] > oom["capacity_bytes"]


def test_trace_is_perfetto_loadable_json(write_scenario, tmp_path, capsys):
    trace = tmp_path / "t.json"
    assert main(["run", str(write_scenario(TINY)), "--trace", str(trace), "--steps", "2"]) == 0
    data = json.loads(trace.read_text())
    events = data["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert any("compute" in n for n in names) and any("all-gather" in n for n in names)
    coll = [e for e in events if e["ph"] == "X" and e["cat"] == "collective"]
    assert coll and {"Collective name", "In msg nelems", "Out msg nelems", "Group size"} <= set(coll[0]["args"])
    assert any(e["ph"] == "C" for e in events)
    assert {e["args"]["step"] for e in events if e["ph"] == "X"} == {1}   # the last step's records only


def test_full_mode_and_event_table(write_scenario, tmp_path, capsys):
    csv = tmp_path / "events.csv"
    code, rep = run_json([str(write_scenario(TINY))], capsys)
    code_full = main(["run", str(write_scenario(TINY)), "--mode", "full", "--json", "--events", str(csv)])
    full = json.loads(capsys.readouterr().out)
    assert code == code_full == 0 and full["step_time_s"] == pytest.approx(rep["step_time_s"], rel=1e-9)
    header = csv.read_text().splitlines()[0]
    assert header.startswith("rank,node,step,stream,kind,name,op,layer,phase")


def test_tensor_and_pipeline_parallel_run(write_scenario, capsys):
    text = TINY.replace("nodes = 1", "nodes = 1\n[parallel]\ntp = 2\npp = 2").replace("stage = 3", "stage = 1")
    text = text.replace("grad_accum = 2", "grad_accum = 4")
    code, out = run_json([str(write_scenario(text))], capsys)
    assert code == 0 and out["time"]["bubble_s"] > 0
    groups = {(c["op"], c["group"]) for c in out["comm"]}
    assert ("all_reduce", "tp") in groups and ("send_recv", "pp") in groups
    assert sum(out["time"].values()) == pytest.approx(out["step_time_s"], rel=1e-9)


def test_fsdp2_pipeline_that_reshards_after_forward_is_refused_clearly(write_scenario, capsys):
    """torchtitan pipelines keep parameters gathered (reshard_after_forward = false); a resharding
    FSDP2 pipeline is not simulated and says so, naming the key and what is allowed."""
    text = TINY.replace("nodes = 1", "nodes = 1\n[parallel]\npp = 2").replace("[zero]\nstage = 3\n", "[fsdp]\n")
    code = main(["run", str(write_scenario(text))])
    err = capsys.readouterr().err
    assert code == 2 and "fsdp.reshard_after_forward" in err and "allowed" in err and "Traceback" not in err
    kept = text.replace("[fsdp]\n", "[fsdp]\nreshard_after_forward = false\n")
    assert main(["run", str(write_scenario(kept))]) == 0


def test_check_prints_des_and_analytic(write_scenario, capsys):
    assert main(["check", str(write_scenario(TINY))]) == 0
    out = capsys.readouterr().out
    assert "bytes/rank all_gather" in out and "step time <= serial sum" in out and " NO" not in out


def test_collective_summary_has_log_summary_columns(write_scenario):
    from sim.inputs.load import load_scenario
    from sim.results.tables import collective_summary
    from sim.simulate import simulate
    table = collective_summary(simulate(load_scenario(write_scenario(TINY))))
    assert list(table.columns) == ["op", "message_bytes", "group_size", "count", "total_latency_ms",
                                   "avg_latency_ms", "algbw_GBps", "busbw_GBps"]
    assert (table["busbw_GBps"] > 0).all() and set(table["op"]) == {"all_gather", "reduce_scatter", "all_reduce"}
