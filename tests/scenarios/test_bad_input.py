"""Malformed input, tried as a new user would: exit 2 and one line naming file, key, allowed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sim.cli import main

GOOD = """\
model = "llama2-7b"
cluster = "dgx-a100-80g"
nodes = 2

[training]
seq_len = 4096
micro_batch = 1
global_batch = 256
precision = "bf16"

[zero]
stage = 3
"""

CASES = {  # name: (scenario text, key named in the message, words that say what is allowed)
    "missing key": (GOOD.replace("nodes = 2\n", ""), "nodes", "missing required key; allowed: an integer > 0"),
    "unknown key": (GOOD.replace("nodes = 2", "nodez = 2"), "nodez", "allowed: aio, cluster, comm, compute, ddp, deepspeed"),
    "wrong type": (GOOD.replace("nodes = 2", 'nodes = "two"'), "nodes", "allowed: an integer"),
    "unknown model": (GOOD.replace('"llama2-7b"', '"llama-9b"'), "model", "allowed: gpt2, gpt2-hf, gpt2-large"),
    "unknown cluster": (GOOD.replace('"dgx-a100-80g"', '"dgx-z100"'), "cluster", "allowed: dgx-a100-40g"),
    "inconsistent batch": (GOOD.replace("global_batch = 256", "global_batch = 100\ngrad_accum = 8"),
                           "training.global_batch", "allowed: training.global_batch = training.micro_batch"),
    "tp not dividing heads": (GOOD.replace("nodes = 2", "nodes = 1\ngpus_per_node = 6\n[parallel]\ntp = 3"),
                              "parallel.tp", "allowed: a divisor of 32"),
    "bad enum": (GOOD.replace('"bf16"', '"bf17"'), "training.precision", "allowed: fp32, fp16, bf16"),
    "zero stage 7": (GOOD.replace("stage = 3", "stage = 7"), "zero.stage", "allowed: 0, 1, 2, 3"),
    "unknown zero key": (GOOD.replace("stage = 3", "stage = 3\nprefetch_buket_size = 1"),
                         "zero.prefetch_buket_size", "allowed: allgather_bucket_size"),
    "world size": (GOOD.replace("nodes = 2", "nodes = 2\n[parallel]\ntp = 4\npp = 2\ndp = 4"), "parallel",
                   "!= nodes x gpus_per_node = 16"),
    "zero-2 with pipeline": (GOOD.replace("stage = 3", "stage = 2").replace(
        "nodes = 2", "nodes = 2\n[parallel]\npp = 2"), "zero.stage", "allowed: 0, 1"),
    "bf16 on V100": (GOOD.replace('"dgx-a100-80g"', '"dgx2"').replace("global_batch = 256", "global_batch = 512"),
                     "training.precision", "allowed: fp16, fp32"),
    "too many gpus per node": (GOOD.replace("nodes = 2", "nodes = 2\ngpus_per_node = 16"), "gpus_per_node",
                               "allowed: 1..8"),
    "toml syntax": (GOOD.replace("nodes = 2", "nodes = = 2"), "", "not valid TOML"),
    "zero and fsdp": (GOOD + "\n[fsdp]\n", "fsdp", "exclude each other"),
}


def run_cli(args, capsys):
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("case", CASES)
def test_bad_scenario_exits_2_with_one_clear_line(case, write_scenario, capsys):
    text, key, allowed = CASES[case]
    path = write_scenario(text)
    code, out, err = run_cli(["memory", str(path)], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert str(path) in err and (not key or f": {key}: " in err) and allowed in err, err


def test_bad_ds_config_names_the_json_file(write_scenario, capsys):
    ds = {"bf16": {"enabled": True}, "fp16": {"enabled": True}, "train_micro_batch_size_per_gpu": 1}
    path = write_scenario(GOOD.replace("[zero]\nstage = 3\n", "").replace(
        'nodes = 2', 'nodes = 2\ndeepspeed = "ds.json"').replace('precision = "bf16"\n', "")
        .replace("micro_batch = 1\nglobal_batch = 256\n", ""), ds__json=json.dumps(ds))
    code, _, err = run_cli(["memory", str(path)], capsys)
    assert code == 2 and "ds.json: bf16.enabled: fp16 and bf16 cannot both be enabled" in err


def test_unknown_bundled_scenario_name(capsys):
    code, _, err = run_cli(["memory", "llama-9b_zero3"], capsys)
    assert code == 2 and "command line: scenario: unknown scenarios catalog name 'llama-9b_zero3'" in err


def test_missing_scenario_file(capsys):
    code, _, err = run_cli(["memory", "no/such/file.toml"], capsys)
    assert code == 2 and "no/such/file.toml: file not found" in err


@pytest.mark.parametrize(("args", "flag"), [(["--params", "7x"], "--params"),
                                            (["--params", "7B", "--gpu-memory", "lots"], "--gpu-memory"),
                                            (["--params", "7B", "--dp", "0"], "--dp")])
def test_bad_flags(args, flag, capsys):
    code, _, err = run_cli(["memory", *args], capsys)
    assert code == 2 and f"command line: {flag}:" in err and "allowed" in err


def test_installed_command_prints_no_traceback(write_scenario):
    path = write_scenario(CASES["unknown model"][0])
    p = subprocess.run([sys.executable, "-m", "sim.cli", "memory", str(path)], capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "llama-9b" in p.stderr
