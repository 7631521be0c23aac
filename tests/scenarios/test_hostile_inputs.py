"""Hostile input, one test per class the reliability issue found: every outcome is exit 0 or
3 with a result, or exit 2 with one line naming the file and the key; never a traceback,
a hang, unbounded memory, or a silently accepted wrong value."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from sim.cli import main
from tests.conftest import ROOT
from tests.scenarios.test_bad_input import GOOD

SCENARIO = "# a small valid scenario the cases below break\n" + GOOD
TINY = {"layers": 2, "hidden": 256, "heads": 4, "kv_heads": 4, "ffn_hidden": 512, "vocab": 1000}
HF_LLAMA = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}


def outcome(argv: list[str], capsys) -> tuple[int, str, str]:
    """Run the CLI in-process and check the contract every answer must keep."""
    start = time.monotonic()
    code = main(argv)
    out, err = capsys.readouterr()
    assert time.monotonic() - start < 30, "no answer within seconds"
    assert code in (0, 2, 3), (code, err)
    assert "Traceback" not in err
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("zerosim: error: ") and not out, err
    elif "--json" in argv:
        json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in JSON output"))
    return code, out, err


def refused(argv: list[str], capsys, *words: str) -> str:
    code, _, err = outcome(argv, capsys)
    assert code == 2, f"accepted: {argv}"
    for word in words:
        assert word in err, (word, err)
    return err


def scenario_with(tmp_path: Path, text: str = SCENARIO, name: str = "s.toml", **files: str | bytes) -> str:
    for fname, content in files.items():
        path = tmp_path / fname.replace("__", ".")
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


def toml_value(value: object) -> str:
    return json.dumps(value) if not isinstance(value, dict) else \
        "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"


# -- files that cannot be read --------------------------------------------------------------
BAD_BYTES = {
    "latin-1": ("# caf\xe9\n" + SCENARIO).encode("latin-1"),
    "utf-16": SCENARIO.encode("utf-16"),
    "binary": bytes(range(256)) * 8,
    "nul bytes": b"model = \"x\"\x00\n",
    "empty": b"",
}


@pytest.mark.parametrize("kind", sorted(BAD_BYTES))
@pytest.mark.parametrize("role", ["scenario", "model toml", "hf config", "cluster", "ds_config"])
def test_unreadable_bytes_in_any_input_file(tmp_path, capsys, role, kind):
    data = BAD_BYTES[kind]
    if role == "scenario":
        (tmp_path / "s.toml").write_bytes(data)
        path = str(tmp_path / "s.toml")
    else:
        name, ref = {"model toml": ("m.toml", 'model = "m.toml"'), "hf config": ("config.json", 'model = "config.json"'),
                     "cluster": ("c.toml", 'cluster = "c.toml"'),
                     "ds_config": ("ds.json", 'deepspeed = "ds.json"')}[role]
        text = SCENARIO.replace('model = "llama2-7b"', ref) if role in ("model toml", "hf config") else \
            SCENARIO.replace('cluster = "dgx-a100-80g"', ref) if role == "cluster" else \
            SCENARIO.replace("[zero]\nstage = 3\n", "").replace("nodes = 2", f"nodes = 2\n{ref}")
        path = scenario_with(tmp_path, text, **{name.replace(".", "__"): data})
    err = refused(["memory", path], capsys)
    if kind in ("latin-1", "utf-16", "binary", "nul bytes"):
        assert "UTF" in err or "NUL" in err, err


def test_a_utf8_bom_is_fine(tmp_path, capsys):
    (tmp_path / "s.toml").write_bytes(b"\xef\xbb\xbf" + SCENARIO.encode())
    assert outcome(["memory", str(tmp_path / "s.toml")], capsys)[0] == 0


@pytest.mark.parametrize("what", ["folder", "fifo", "symlink loop", "long name", "dev zero", "missing"])
def test_files_that_are_not_files(tmp_path, capsys, what):
    target = tmp_path / "x.toml"
    if what == "folder":
        target.mkdir()
    elif what == "fifo":
        os.mkfifo(target)
    elif what == "symlink loop":
        os.symlink(tmp_path / "y.toml", target)
        os.symlink(target, tmp_path / "y.toml")
    elif what == "long name":
        target = tmp_path / ("x" * 300 + ".toml")
    elif what == "dev zero":
        os.symlink("/dev/zero", target)
    refused(["memory", str(target)], capsys, str(target)[:40])
    refused(["memory", scenario_with(tmp_path, SCENARIO.replace('"llama2-7b"', f'"{target}"'))], capsys, "model")


def test_oversized_file(tmp_path, capsys):
    (tmp_path / "s.toml").write_text(SCENARIO + "#" * (2 << 20))
    refused(["memory", str(tmp_path / "s.toml")], capsys, "at most 1,048,576")


# -- parser bombs and numbers out of range ---------------------------------------------------
def test_deeply_nested_toml_and_json(tmp_path, capsys):
    deep = "[" * 50_000 + "]" * 50_000
    refused(["memory", scenario_with(tmp_path, SCENARIO + f"\n[comm]\nbusbw_GBps = {{dp = {deep}}}\n")], capsys)
    hf = json.dumps(HF_LLAMA)[:-1] + ', "x": ' + deep + "}"
    refused(["memory", scenario_with(tmp_path, SCENARIO.replace('"llama2-7b"', '"config.json"'),
                                     config__json=hf)], capsys, "config.json")


@pytest.mark.parametrize("digits", [500, 5000])
@pytest.mark.parametrize("key", ["nodes", "seq_len", "reduce_bucket_size"])
def test_integers_of_hundreds_of_digits(tmp_path, capsys, key, digits):
    old = {"nodes": "nodes = 2", "seq_len": "seq_len = 4096", "reduce_bucket_size": "stage = 3"}[key]
    new = old.replace("2", "9" * digits) if key == "nodes" else old.replace("4096", "9" * digits) \
        if key == "seq_len" else old + f"\nreduce_bucket_size = {'9' * digits}"
    refused(["memory", scenario_with(tmp_path, SCENARIO.replace(old, new))], capsys)


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
@pytest.mark.parametrize("key", ["memory_GiB", "fp16_TFLOPS", "bandwidth_GBps", "busbw"])
def test_non_finite_numbers(tmp_path, capsys, key, value):
    if key == "busbw":
        text = SCENARIO + f"\n[comm]\nbusbw_GBps = {{dp = {value}}}\n"
        refused(["run", scenario_with(tmp_path, text), "--json"], capsys, "comm.busbw_GBps.dp", "finite")
        return
    cluster = (ROOT / "hardware" / "dgx-a100-80g.toml").read_text()
    gpu = (ROOT / "hardware" / "gpus" / "a100-sxm4-80g.toml").read_text()
    for name, text in (("c.toml", cluster), ("g.toml", gpu)):
        lines = [f"{key} = {value}" if line.startswith(f"{key} =") else line for line in text.splitlines()]
        (tmp_path / name).write_text("\n".join(lines).replace('gpu = "gpus/a100-sxm4-80g.toml"', 'gpu = "g.toml"'))
    err = refused(["run", scenario_with(tmp_path, SCENARIO.replace('"dgx-a100-80g"', '"c.toml"')), "--json"], capsys)
    assert key in err and "finite" in err


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "1e400"])
def test_non_finite_json(tmp_path, capsys, literal):
    hf = json.dumps(HF_LLAMA).replace('"hidden_size": 256', f'"hidden_size": {literal}')
    refused(["memory", scenario_with(tmp_path, SCENARIO.replace('"llama2-7b"', '"config.json"'),
                                     config__json=hf)], capsys, "hidden_size")


# -- Hugging Face and DeepSpeed values, in the user's terms ----------------------------------
@pytest.mark.parametrize(("field", "value"), [
    ("num_key_value_heads", "8"), ("head_dim", "128"), ("num_key_value_heads", -8), ("num_key_value_heads", 0),
    ("head_dim", -128), ("num_hidden_layers", 2.5), ("hidden_size", True), ("hidden_size", 0),
    ("tie_word_embeddings", "no"), ("num_key_value_heads", 3), ("num_hidden_layers", 10**9),
])
def test_hf_config_values(tmp_path, capsys, field, value):
    hf = json.dumps({**HF_LLAMA, field: value})
    refused(["memory", scenario_with(tmp_path, SCENARIO.replace('"llama2-7b"', '"config.json"'), config__json=hf)],
            capsys, "config.json", field)


def test_gpt2_n_inner(tmp_path, capsys):
    gpt2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128, "vocab_size": 100,
            "n_inner": -5}
    refused(["memory", scenario_with(tmp_path, SCENARIO.replace('"llama2-7b"', '"config.json"'),
                                     config__json=json.dumps(gpt2))], capsys, "n_inner")


def ds_scenario(tmp_path, ds: dict) -> str:
    text = SCENARIO.replace("[zero]\nstage = 3\n", "").replace("nodes = 2", 'nodes = 2\ndeepspeed = "ds.json"')
    text = text.replace("global_batch = 256\n", "").replace("micro_batch = 1\n", "")
    return scenario_with(tmp_path, text, ds__json=json.dumps({"bf16": {"enabled": True}, **ds}))


@pytest.mark.parametrize(("ds", "words"), [
    ({"train_batch_size": 100, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8},
     ("ds.json: train_batch_size",)),
    ({"train_batch_size": 16, "activation_checkpointing": {"partition_activations": "no"}},
     ("activation_checkpointing.partition_activations",)),
    ({"train_batch_size": 16, "zero_optimization": {"stage": "3"}}, ("zero_optimization.stage",)),
    ({"train_batch_size": 16, "prescale_gradients": True}, ("not simulated yet",)),
    ({"train_batch_size": 16, "activation_checkpointing": {"contiguous_memory_optimization": True}},
     ("activation_checkpointing.contiguous_memory_optimization", "with partition_activations = true")),
    ({"train_batch_size": 16, "activation_checkpointing": {"synchronize_checkpoint_boundary": True}},
     ("activation_checkpointing.synchronize_checkpoint_boundary", "not simulated yet")),
    ({"train_batch_size": 16, "aio": {"use_gds": True}}, ("aio.use_gds", "not simulated yet")),
    ({"train_batch_size": 16, "zero_optimization": {"stage": 3, "zero_quantized_nontrainable_weights": True}},
     ("not simulated yet",)),
])
def test_ds_config_values(tmp_path, capsys, ds, words):
    refused(["memory", ds_scenario(tmp_path, ds)], capsys, *words)


# -- work the simulator cannot do in reasonable time and memory ------------------------------
@pytest.mark.parametrize("command", ["memory", "run"])
def test_work_bombs_are_refused_or_answered_quickly(tmp_path, capsys, command):
    bombs = [
        SCENARIO.replace('"llama2-7b"', toml_value({**TINY, "layers": 10**9})),
        SCENARIO.replace("nodes = 2", "nodes = 10000000"),
        SCENARIO.replace("global_batch = 256", "global_batch = 16000000000"),
        SCENARIO.replace('"llama2-7b"', toml_value({**TINY, "family": "mixtral", "experts": 10**6,
                                                    "experts_per_token": 2})),
        SCENARIO.replace("[zero]\nstage = 3\n", "[fsdp]\nforward_prefetch = 1000000000\n"
                         "backward_prefetch = 1000000000\n").replace('"llama2-7b"', toml_value(TINY)),
    ]
    for text in bombs:
        outcome([command, scenario_with(tmp_path, text), "--json"], capsys)


def test_large_accumulation_is_refused_by_run_and_answered_by_memory(tmp_path, capsys):
    path = scenario_with(tmp_path, SCENARIO.replace("global_batch = 256", "global_batch = 16000000000"))
    refused(["run", path], capsys, "(engine work)", "allowed: at most")
    assert outcome(["memory", path], capsys)[0] in (0, 3)


def test_many_steps(capsys):
    refused(["run", "llama3-8b_fsdp2_dgx-h100x1", "--steps", "1000000000"], capsys, "--steps")


# -- flags -----------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["memory", "--params", "."], ["memory", "--params", "1.2.3B"], ["memory", "--params", "1e400"],
    ["memory", "--params", "-5"], ["memory", "--params", "nan"], ["memory", "--params", "1B", "--gpu-memory", "0GB"],
    ["memory", "--params", "1B", "--gpu-memory", "-1GB"], ["memory", "--params", "1B", "--k", "-20"],
    ["memory", "--params", "1B", "--k", "nan"], ["memory", "--params", "1B", "--k", "inf"],
    ["memory", "--params", "1B", "--dp", "0"], ["memory", "--params", "1B", "--dp", "10000000000000"],
    ["memory", "--params", "1B", "--largest-module", "2B"], ["memory", "--params", "1B", "--fragmentation", "nan"],
    ["memory", "--params", "1B", "--fragmentation", "2"], ["run", "gpt2-xl_zero1_dgx1-v100x1", "--steps", "0"],
    ["run", "gpt2-xl_zero1_dgx1-v100x1", "--steps", "1e9"], ["run", "gpt2-xl_zero1_dgx1-v100x1", "--mode", "bogus"],
    ["run", "gpt2-xl_zero1_dgx1-v100x1", "--bogus"], ["run"], ["bogus"], [],
])
def test_flags_are_checked_and_refused_in_one_line(capsys, argv):
    refused(argv, capsys, "command line")


def test_k_changes_the_table_and_the_footer_alike(capsys):
    _, out, _ = outcome(["memory", "--params", "7.5e9", "--dp", "64", "--gpu-memory", "32GB", "--k", "6"], capsys)
    assert "3.2B" in out.splitlines()[4] and "DP (no ZeRO) 3.2B" in out.splitlines()[-1]


# -- output paths: checked before any work, nothing printed ----------------------------------
@pytest.mark.parametrize("where", ["missing folder", "a folder", "bad type"])
@pytest.mark.parametrize("flag", ["--trace", "--events", "--plot"])
def test_output_paths_are_checked_first(tmp_path, capsys, flag, where):
    target = {"missing folder": str(tmp_path / "no" / "out.json"), "a folder": str(tmp_path),
              "bad type": str(tmp_path / "out.bogus")}[where]
    if flag == "--plot":
        argv = ["memory", "--params", "1B", "--plot", target.replace(".json", ".png")]
    else:
        argv = ["run", "gpt2-xl_zero1_dgx1-v100x1", flag, target.replace(".json", ".csv" if flag == "--events" else ".json")]
    refused(argv, capsys, flag)


# -- accepted but not simulated: refused until they are; host memory is part of "fits" -------
@pytest.mark.parametrize("zero", [
    "zero_quantized_nontrainable_weights = true", "zero_hpz_partition_size = 4",
    'offload_optimizer = {device = "cpu", cpuadam_cores_perc = 0.5}', 'offload_param = {device = "cpu", max_in_cpu = 1000}',
    "contiguous_gradients = false", "allgather_sequential = true",
])
@pytest.mark.parametrize("command", ["run", "memory"])
def test_zero_features_not_simulated_yet(tmp_path, capsys, command, zero):
    path = scenario_with(tmp_path, SCENARIO.replace("stage = 3", f"stage = 3\n{zero}"))
    refused([command, path], capsys, "not simulated yet")


@pytest.mark.parametrize("text", [
    SCENARIO.replace("stage = 3", 'stage = 2\noffload_optimizer = "cpu"').replace("nodes = 2", 'nodes = 2\nschedule = "paper"'),
    SCENARIO.replace("[zero]\nstage = 3\n", "[fsdp]\n").replace("nodes = 2", "nodes = 2\n[parallel]\npp = 2"),
    SCENARIO.replace("[zero]\nstage = 3\n", '[ddp]\nparameters_as_bucket_view = true\n').replace(
        "nodes = 2", 'nodes = 2\nengine = "ddp-zero-redundancy"'),
])
@pytest.mark.parametrize("command", ["run", "memory"])
def test_combinations_not_simulated_yet_are_refused_by_every_command(tmp_path, capsys, command, text):
    refused([command, scenario_with(tmp_path, text)], capsys, "not simulated yet")


@pytest.mark.parametrize("fsdp, key", [("reshard_after_forward = 16", "fsdp.reshard_after_forward"),
                                        ("reshard_after_forward = 3", "fsdp.reshard_after_forward"),
                                        ("replicate_degree = 3", "fsdp.replicate_degree")])
def test_fsdp_meshes_that_torch_would_refuse_are_refused(tmp_path, capsys, fsdp, key):
    refused(["run", scenario_with(tmp_path, SCENARIO.replace("[zero]\nstage = 3\n", f"[fsdp]\n{fsdp}\n"))],
            capsys, key)


@pytest.mark.parametrize("where", ["offload_optimizer", "offload_param"])
def test_nvme_offload_needs_a_cluster_with_nvme_figures(tmp_path, capsys, where):
    path = scenario_with(tmp_path, SCENARIO.replace("stage = 3", f'stage = 3\n{where} = {{device = "nvme", nvme_path = "/tmp"}}'))
    refused(["run", path], capsys, f"zero.{where}.device", "nvme_bandwidth_GBps or nvme_TB")


def test_host_memory_is_part_of_fits(tmp_path, capsys):
    """Llama-3.1-405B with optimizer offload on one DGX H100: about 0.8 TB of pinned host
    memory per GPU, 6.5 TB per node against 2 TiB of DRAM."""
    text = SCENARIO.replace('"llama2-7b"', '"llama3-405b"').replace('"dgx-a100-80g"', '"dgx-h100"').replace(
        "nodes = 2", "nodes = 1").replace("global_batch = 256", "global_batch = 8").replace(
        "stage = 3", 'stage = 3\noffload_optimizer = "cpu"\noffload_param = "cpu"')
    path = scenario_with(tmp_path, text)
    code, out, _ = outcome(["run", path, "--json"], capsys)
    memory = json.loads(out)["memory"]
    assert code == 3 and not memory["fits_host"] and memory["host_bytes_per_node"] > 6e12
    assert memory["host_capacity_bytes"] == 2048 * 2**30
    code, out, _ = outcome(["memory", path], capsys)
    assert code == 3 and "per node of 2199.0 GB DRAM: DOES NOT FIT" in out


def test_json_is_strict_when_a_row_is_unbounded(capsys):
    code, out, _ = outcome(["memory", "--params", "1B", "--k", "0", "--dp", "1000000", "--gpu-memory", "80GB",
                            "--json"], capsys)
    assert code == 0 and "Infinity" not in out


def test_python_m_sim_cli_is_the_same_command():
    import subprocess
    p = subprocess.run([sys.executable, "-m", "sim.cli", "memory", "--params", "."], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.count("\n") == 1
