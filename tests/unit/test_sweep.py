"""`zerosim sweep` / `sim.sweep`: the product of scenario-key values, one row per point,
infeasible points kept with their reason, the same table whatever the number of workers."""

from __future__ import annotations

import pandas as pd
import pytest

import sim
from sim.cli import main
from sim.core.errors import InputError
from sim.studies.sweep import parse_vary, variant

SCENARIO = """
model = { name = "tiny", layers = 4, hidden = 512, heads = 8, kv_heads = 8, ffn_hidden = 1376, vocab = 8000 }
cluster = "dgx-a100-80g"
nodes = 1
[training]
seq_len = 512
global_batch = 32
micro_batch = 2
precision = "bf16"
[zero]
stage = 2
"""


@pytest.fixture
def scenario(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(SCENARIO)
    return path


def test_a_3_by_3_sweep_returns_9_rows_in_product_order_the_same_with_one_or_two_workers(scenario):
    vary = {"zero.stage": [1, 2, 3], "training.micro_batch": [1, 2, 4]}
    serial = sim.sweep(scenario, vary, jobs=1)
    parallel = sim.sweep(scenario, vary, jobs=2)
    assert len(serial) == 9 and list(serial["zero.stage"]) == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert list(serial["training.micro_batch"]) == [1, 2, 4] * 3
    pd.testing.assert_frame_equal(serial, parallel)
    assert serial["feasible"].all() and (serial["step_time_s"] > 0).all()
    for column in ("tokens_per_s", "mfu", "peak_bytes", "exposed_comm_s", "bound", "fits", "reason"):
        assert column in serial.columns
    # more micro-steps for the same global batch at micro-batch 1: a longer ZeRO-2 step
    two = serial[serial["zero.stage"] == 2].set_index("training.micro_batch")["step_time_s"]
    assert two[1] > two[4]


def test_infeasible_points_stay_with_their_reason(scenario):
    table = sim.sweep(scenario, {"parallel.tp": [1, 3]}, jobs=1)
    assert list(table["feasible"]) == [True, False]
    assert "tp (3)" in table["reason"][1] and "not divisible" in table["reason"][1]
    assert pd.isna(table["step_time_s"][1])


def test_values_are_read_as_toml_and_keys_set_in_nested_tables():
    assert parse_vary("zero.reduce_bucket_size=5e8,1e9") == ("zero.reduce_bucket_size", [5e8, 1e9])
    assert parse_vary("zero.offload_optimizer=cpu,none")[1] == ["cpu", "none"]
    assert parse_vary('training.recompute="full",none')[1] == ["full", "none"]
    assert variant({"training": {"seq_len": 8}}, {"comm.busbw_GBps.dp": 100}) == {
        "training": {"seq_len": 8}, "comm": {"busbw_GBps": {"dp": 100}}}
    for bad in ("zero.stage", "=1,2", "zero.stage=", "zero stage=1", "zero.stage=1,,2"):
        with pytest.raises(InputError):
            parse_vary(bad)


def test_the_command_writes_the_whole_table_and_refuses_what_it_cannot_do(scenario, tmp_path, capsys):
    out = tmp_path / "sweep.csv"
    assert main(["sweep", str(scenario), "--vary", "zero.stage=1,3", "--jobs", "1", "--csv", str(out),
                 "--no-progress"]) == 0
    table = pd.read_csv(out)
    assert len(table) == 2 and "step_time_s" in capsys.readouterr().out
    for argv, words in ((["--vary", "zero.stage=1", "--backend", "ray"], "not supported yet"),
                        (["--vary", "zero.stage=1", "--vary", "zero.stage=2"], "given twice"),
                        (["--vary", "zero.stage"], "KEY=V1,V2"),
                        (["--vary", "zero.stage=1", "--csv", str(tmp_path / "x.txt")], "--csv")):
        assert main(["sweep", str(scenario), *argv]) == 2
        assert words in capsys.readouterr().err


def test_the_dask_backend_returns_the_same_table(scenario):
    pytest.importorskip("distributed")
    vary = {"zero.stage": [1, 3], "training.micro_batch": [1, 2]}
    pd.testing.assert_frame_equal(sim.sweep(scenario, vary, jobs=1), sim.sweep(scenario, vary, jobs=2, backend="dask"))
