"""Audit: does the `zerosim` command keep its contract on malformed and hostile inputs?

Builds a corpus of about 370 hostile inputs (unreadable files, parser bombs, type confusion,
nonsense values, work bombs, bad flags, unwritable output paths, keys accepted but not
simulated, random mutations of the bundled scenarios), runs each as a `zerosim` subprocess in
its own temporary folder and judges the outcome against the contract:

- the exit status is 0 (fits), 3 (does not fit; the result is still printed) or 2 (bad
  input); never another status, never "Traceback" on stderr, never a hang (per-case timeout,
  default 30 s), never runaway memory (each child runs under RLIMIT_AS = 4 GiB; the audit
  also kills a process group that holds more than 4 GiB or more than 16 processes);
- exit 2: stderr is exactly one non-empty line, starting with "zerosim: error: " and
  naming a file (.toml / .json) or "command line"; some cases also name substrings the
  message must (or must not) contain;
- exit 0 / 3 with --json: stdout is strict JSON (no NaN, Infinity, -Infinity);
- each case's expectation: `refuse` (exit 2; exit 0/3 is accepted nonsense), `answer`
  (exit 0 or 3), `either`, or `exit3` (exit 3 and host memory numbers in the output);
- output-path flags (--trace, --events, --plot) that cannot be written: exit 2 before the
  result is printed (stdout empty).

Run from anywhere (a benchmark, not a test; slow is fine):

    python bench/hostile_inputs.py [--only SUBSTRING] [--jobs N] [--timeout S] [--json OUT.json]

It prints one line per case that breaks the contract, then a table by class (cases, ok,
broken, skipped), and exits 1 if any case is broken, else 0. `--list` prints the case ids.
Children run with HOME and TMPDIR set to their temporary folder, so nothing is written
outside it. Linux only (/proc, FIFOs).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import random
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TIMEOUT_S = 30.0
TORCH_TIMEOUT_S = 30.0          # calibrate / validate: must refuse before any torch work
MEMORY_CAP = 4 * 2**30          # RLIMIT_AS of every child, and the cap on a whole process group
MAX_PROCESSES = 16              # e.g. `validate --worlds 1000` must not fork a thousand workers
POLL_S = 0.2
PREFIX = "zerosim: error: "
REFUSE, ANSWER, EITHER, EXIT3 = "refuse", "answer", "either", "exit3"
CLASSES = ("control", "unreadable", "parser-bomb", "type-confusion", "nonsense", "work-bomb", "cli-flag",
           "output-path", "not-simulated", "mutation")
BOMB_DEPTH = 50_000
HOST_WORD = re.compile(r"\bhost\b", re.IGNORECASE)


# ---------------------------------------------------------------------------------------------
# Cases and the files they write


@dataclass(frozen=True)
class Special:
    """A file-system object that is not a plain file: a directory, a FIFO, a symlink."""
    kind: str            # dir | fifo | link | readonly-dir
    target: str = ""


DIR, FIFO, READONLY_DIR = Special("dir"), Special("fifo"), Special("readonly-dir")


def link(target: str) -> Special:
    return Special("link", target)


FileContent = str | bytes | Special


@dataclass
class Case:
    id: str                                  # "<class>/<what>"; the class is the first part
    argv: tuple[str, ...]                    # after `zerosim`; relative paths live in the case folder
    files: dict[str, FileContent] = field(default_factory=dict)
    expect: str = REFUSE
    mentions: tuple[str, ...] = ()           # a refusal must contain each of these
    forbids: tuple[str, ...] = ()            # ... and none of these
    timeout_s: float | None = None           # None: the --timeout default
    stdout_empty: bool = False               # output-path cases: refuse before printing
    needs_non_root: bool = False             # permission checks do not apply to root

    @property
    def klass(self) -> str:
        return self.id.split("/", 1)[0]


def materialise(folder: Path, files: dict[str, FileContent]) -> None:
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif isinstance(content, str):
            path.write_text(content, encoding="utf-8")
        elif content.kind == "dir":
            path.mkdir()
        elif content.kind == "readonly-dir":
            path.mkdir()
            path.chmod(0o555)
        elif content.kind == "fifo":
            os.mkfifo(path)
        elif content.kind == "link":
            path.symlink_to(content.target)
        else:
            raise ValueError(f"unknown special file {content.kind}")


# ---------------------------------------------------------------------------------------------
# Writing TOML and JSON (the standard library reads both but writes only JSON)


class Raw(str):
    """Text written as is into TOML or JSON: a 5000-digit integer, a 50,000-deep array, 1e400."""


DELETE = object()


def edited(table: dict[str, Any], changes: dict[str, Any] | None = None) -> dict[str, Any]:
    """A deep copy of `table` with dotted keys set ("training.seq_len": -1) or DELETEd."""
    result = copy.deepcopy(table)
    for dotted, value in (changes or {}).items():
        *parents, key = dotted.split(".")
        node = result
        for part in parents:
            node = node.setdefault(part, {})
        if value is DELETE:
            node.pop(key, None)
        else:
            node[key] = value
    return result


def toml_text(table: dict[str, Any], header: str = "# malformed-input audit case") -> str:
    lines = [header] if header else []
    _toml_table(table, [], lines)
    return "\n".join(lines) + "\n"


def _toml_table(table: dict[str, Any], path: list[str], lines: list[str]) -> None:
    if path:
        lines.append(f"\n[{'.'.join(_toml_key(p) for p in path)}]")
    for key, value in table.items():
        if not isinstance(value, dict):
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    for key, value in table.items():
        if isinstance(value, dict):
            _toml_table(value, [*path, key], lines)


def _toml_key(key: str) -> str:
    return key if key and all(c.isalnum() or c in "_-" for c in key) and key.isascii() else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)          # a TOML basic string: \" \\ \uXXXX escapes
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} as TOML")


def json_text(data: Any) -> str:
    """json.dumps, with Raw values spliced in verbatim (NaN, 1e400, a 50,000-deep array)."""
    raws: dict[str, str] = {}

    def mark(node: Any) -> Any:
        if isinstance(node, Raw):
            token = f"@@raw{len(raws)}@@"
            raws[f'"{token}"'] = str(node)
            return token
        if isinstance(node, dict):
            return {k: mark(v) for k, v in node.items()}
        if isinstance(node, list):
            return [mark(v) for v in node]
        return node

    text = json.dumps(mark(data), indent=2)
    for token, raw in raws.items():
        text = text.replace(token, raw)
    return text + "\n"


def nested(depth: int, kind: str) -> Raw:
    """A value nested `depth` deep: TOML/JSON arrays, TOML inline tables or JSON objects."""
    if kind == "array":
        return Raw("[" * depth + "1" + "]" * depth)
    if kind == "toml-table":
        return Raw("{a = " * depth + "1" + "}" * depth)
    return Raw('{"a": ' * depth + "1" + "}" * depth)


# ---------------------------------------------------------------------------------------------
# The repository's own inputs, and the base scenarios the cases start from


def repo_text(rel: str) -> str:
    return (ROOT / rel).read_text(encoding="utf-8")


def repo_toml(rel: str) -> dict[str, Any]:
    return tomllib.loads(repo_text(rel))


def repo_json(rel: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(repo_text(rel))
    return data


def cluster_table(name: str = "dgx-a100-80g", gpu: str | None = None) -> dict[str, Any]:
    """A hardware file's table with its GPU reference made absolute (or pointed at `gpu`)."""
    table = repo_toml(f"hardware/{name}.toml")
    table["gpu"] = gpu or str(ROOT / "hardware" / table["gpu"])
    return table


# Llama-2-7B, ZeRO-2, one DGX A100 80GB: fits, and simulates in about a second.
BASE = {"model": "llama2-7b", "cluster": "dgx-a100-80g", "nodes": 1,
        "training": {"seq_len": 2048, "micro_batch": 1, "global_batch": 16, "precision": "bf16",
                     "recompute": "full"},
        "zero": {"stage": 2}}
# ZeRO-3 with CPU optimizer offload on 2 nodes: uses every hardware rate (NVLink, NIC, PCIe, CPU Adam).
OFFLOAD_2NODES = edited(BASE, {"nodes": 2, "training.global_batch": 32, "zero.stage": 3,
                               "zero.offload_optimizer": "cpu"})
# ZeRO-3 on 2 DGX H100 nodes (the ZeRO++ cases).
ZERO3_H100X2 = edited(BASE, {"cluster": "dgx-h100", "nodes": 2, "training.global_batch": 32, "zero.stage": 3})
# A scenario that takes its ZeRO and batch settings from ds.json (the bundled HF Trainer config).
DS_BASE = {"model": "llama2-7b", "cluster": "dgx-a100-80g", "nodes": 1, "deepspeed": "ds.json",
           "training": {"seq_len": 2048, "recompute": "full"}}
FSDP_SCENARIO = "scenarios/llama3-8b_fsdp2_dgx-h100x1.toml"
LLAMA_DIMS = {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 32, "ffn_hidden": 11008, "vocab": 32000}
MIXTRAL_DIMS = {"family": "mixtral", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8,
                "ffn_hidden": 14336, "vocab": 32000, "experts": 8, "experts_per_token": 2}

MEM = ("memory", "--json", "s.toml")
RUN = ("run", "--json", "s.toml")


def scenario_files(table: dict[str, Any] = BASE, changes: dict[str, Any] | None = None,
                   others: dict[str, FileContent] | None = None) -> dict[str, FileContent]:
    """s.toml from a base table and dotted changes, plus the other files of the case (by name)."""
    return {"s.toml": toml_text(edited(table, changes)), **(others or {})}


def hf_files(changes: dict[str, Any], config: str = "llama-2-7b-hf") -> dict[str, FileContent]:
    """An HF config.json (edited) referenced by the base scenario."""
    data = edited(repo_json(f"models/hf/{config}.json"), changes)
    seq = 1024 if config == "gpt2-hf" else 2048
    return scenario_files(BASE, {"model": "config.json", "training.seq_len": seq},
                          others={"config.json": json_text(data)})


def ds_files(changes: dict[str, Any], scenario_changes: dict[str, Any] | None = None,
             table: dict[str, Any] = DS_BASE) -> dict[str, FileContent]:
    """ds.json (the bundled ds_zero2_hf.json, edited) referenced by a scenario."""
    data = edited(repo_json("scenarios/ds_zero2_hf.json"), changes)
    return scenario_files(table, scenario_changes, others={"ds.json": json_text(data)})


def model_files(changes: dict[str, Any], base: str = "llama2-7b") -> dict[str, FileContent]:
    """m.toml (a catalog model file, edited) referenced by the base scenario."""
    model = edited(repo_toml(f"models/{base}.toml"), changes)
    return scenario_files(BASE, {"model": "m.toml"}, others={"m.toml": toml_text(model)})


def cluster_files(changes: dict[str, Any] | None = None, gpu_changes: dict[str, Any] | None = None,
                  table: dict[str, Any] = BASE) -> dict[str, FileContent]:
    """c.toml (DGX A100 80GB, edited) and, with gpu_changes, g.toml (its GPU, edited)."""
    files: dict[str, FileContent] = {}
    if gpu_changes is not None:
        files["g.toml"] = toml_text(edited(repo_toml("hardware/gpus/a100-sxm4-80g.toml"), gpu_changes))
        cluster = cluster_table(gpu="g.toml")
    else:
        cluster = cluster_table()
    files["c.toml"] = toml_text(edited(cluster, changes))
    return scenario_files(table, {"cluster": "c.toml"}, files)


# ---------------------------------------------------------------------------------------------
# 0. Controls: the valid inputs every other case starts from must be answered (else a refusal
#    of a hostile variant proves nothing)


def control_cases() -> Iterator[Case]:
    yield Case("control/base/memory", MEM, scenario_files(BASE), ANSWER)
    yield Case("control/base/run", RUN, scenario_files(BASE), ANSWER)
    yield Case("control/offload-2-nodes-cluster-and-gpu-files/run", RUN,
               cluster_files(gpu_changes={}, table=OFFLOAD_2NODES), ANSWER)
    yield Case("control/model-toml/memory", MEM, model_files({}), ANSWER)
    yield Case("control/hf-config/memory", MEM, hf_files({}), ANSWER)
    yield Case("control/hf-config-gpt2/memory", MEM, hf_files({}, "gpt2-hf"), ANSWER)
    yield Case("control/ds-config/run", RUN, ds_files({}), ANSWER)
    yield Case("control/zero3-h100x2/run", RUN, scenario_files(ZERO3_H100X2), ANSWER)
    yield Case("control/fsdp2/run", RUN, scenario_files(repo_toml(FSDP_SCENARIO)), ANSWER)
    yield Case("control/fsdp2-with-tp2/run", RUN,  # FSDP2 + TP (2D) is simulated since the audit began
               scenario_files(repo_toml(FSDP_SCENARIO), {"parallel.tp": 2}), ANSWER)
    yield Case("control/memory-params", ("memory", "--json", "--params", "7.5e9", "--dp", "64", "--gpu-memory",
                                         "32GB"), expect=ANSWER)


# ---------------------------------------------------------------------------------------------
# 1. Unreadable files


def _reference_layouts() -> dict[str, tuple[str, str, Callable[[str], dict[str, FileContent]]]]:
    """kind -> (default file name, valid content, the other files that reference a name)."""
    def via_scenario(key: str) -> Callable[[str], dict[str, FileContent]]:
        return lambda name: scenario_files(BASE, {key: name})
    gpu_file = repo_text("hardware/gpus/a100-sxm4-80g.toml")
    return {
        "scenario": ("s.toml", toml_text(BASE), lambda name: {}),
        "model-toml": ("m.toml", repo_text("models/llama2-7b.toml"), via_scenario("model")),
        "hf-config": ("config.json", repo_text("models/hf/llama-2-7b-hf.json"), via_scenario("model")),
        "cluster-toml": ("c.toml", toml_text(cluster_table()), via_scenario("cluster")),
        "gpu-toml": ("g.toml", gpu_file, lambda name: scenario_files(
            BASE, {"cluster": "c.toml"}, others={"c.toml": toml_text(cluster_table(gpu=name))})),
        "ds-config": ("ds.json", repo_text("scenarios/ds_zero2_hf.json"),
                      lambda name: scenario_files(DS_BASE, {"deepspeed": name})),
    }


def _latin1(valid: str, name: str) -> bytes:
    """The valid file with one Latin-1 byte (0xE9, 'é') in a comment or an ignored string."""
    if name.endswith(".toml"):
        return b"# caf\xe9: this line is Latin-1, not UTF-8\n" + valid.encode()
    data = json.loads(valid)
    if name == "ds.json":
        data["wandb"] = {"enabled": False, "project": "caf@E9@"}
    else:
        data["_name_or_path"] = "caf@E9@"
    return json_text(data).encode().replace(b"@E9@", b"\xe9")


def unreadable_cases() -> Iterator[Case]:
    for kind, (name, valid, referencing) in _reference_layouts().items():
        ext = Path(name).suffix
        variants: list[tuple[str, str, dict[str, FileContent], str]] = [   # variant, target, files, expect
            ("latin1", name, {name: _latin1(valid, name)}, REFUSE),
            ("utf16-bom", name, {name: valid.encode("utf-16")}, REFUSE),
            ("binary", name, {name: random.Random(7).randbytes(4096)}, REFUSE),
            ("empty", name, {name: b""}, REFUSE),
            ("directory", "dir" + ext, {"dir" + ext: DIR}, REFUSE),
            ("fifo", "fifo" + ext, {"fifo" + ext: FIFO}, REFUSE),
            ("symlink-loop", "loop" + ext, {"loop" + ext: link("loop2" + ext), "loop2" + ext: link("loop" + ext)},
             REFUSE),
            ("name-300-chars", "x" * (300 - len(ext)) + ext, {}, REFUSE),
            ("dev-zero", "zero" + ext, {"zero" + ext: link("/dev/zero")}, REFUSE),
            ("missing", "missing" + ext, {}, REFUSE),
            ("utf8-bom", name, {name: b"\xef\xbb\xbf" + valid.encode()}, ANSWER),
        ]
        for variant, target, files, expect in variants:
            mentions = (target,) if len(target) < 40 and variant != "dev-zero" and expect == REFUSE else ()
            argv = ("memory", "--json", target if kind == "scenario" else "s.toml")
            yield Case(f"unreadable/{kind}/{variant}", argv, {**referencing(target), **files}, expect,
                       mentions=mentions)


# ---------------------------------------------------------------------------------------------
# 2. Parser bombs


RATE_SUFFIXES = ("_GBps", "_Gbps", "_TFLOPS", "_GiB", "_us", "_per_s")


def _rate_keys(table: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """Dotted keys of a hardware table that hold a rate, a size, a latency or an efficiency."""
    for key, value in table.items():
        if isinstance(value, dict):
            yield from _rate_keys(value, f"{prefix}{key}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and (
                key.endswith(RATE_SUFFIXES) or "efficiency" in key):
            yield prefix + key


def parser_bomb_cases() -> Iterator[Case]:
    deep = BOMB_DEPTH
    yield Case("parser-bomb/toml-arrays-50k-deep/scenario", MEM, scenario_files(BASE, {"nodes": nested(deep, "array")}))
    yield Case("parser-bomb/toml-inline-tables-50k-deep/scenario", MEM,
               scenario_files(BASE, {"nodes": nested(deep, "toml-table")}))
    yield Case("parser-bomb/toml-arrays-50k-deep/model-toml", MEM, model_files({"layers": nested(deep, "array")}))
    yield Case("parser-bomb/toml-inline-tables-50k-deep/cluster-toml", MEM,
               cluster_files({"gpus_per_node": nested(deep, "toml-table")}))
    yield Case("parser-bomb/json-arrays-50k-deep/ds-config", MEM,
               ds_files({"zero_optimization": nested(deep, "array")}))
    yield Case("parser-bomb/json-objects-50k-deep/ds-config", MEM,
               ds_files({"zero_optimization": nested(deep, "json-object")}))
    yield Case("parser-bomb/json-arrays-50k-deep/hf-config", MEM,
               hf_files({"num_hidden_layers": nested(deep, "array")}))
    yield Case("parser-bomb/json-objects-50k-deep/hf-config", MEM,
               hf_files({"num_hidden_layers": nested(deep, "json-object")}))

    for digits in (500, 5000):
        huge = Raw("9" * digits)
        yield Case(f"parser-bomb/int-{digits}-digits/nodes", MEM, scenario_files(BASE, {"nodes": huge}))
        yield Case(f"parser-bomb/int-{digits}-digits/training.seq_len", MEM,
                   scenario_files(BASE, {"training.seq_len": huge}))
        yield Case(f"parser-bomb/int-{digits}-digits/zero.reduce_bucket_size", RUN,
                   scenario_files(BASE, {"zero.reduce_bucket_size": huge}), EITHER)
        yield Case(f"parser-bomb/int-{digits}-digits/model.layers", MEM, model_files({"layers": huge}))
    yield Case("parser-bomb/int-5000-digits/hf.num_hidden_layers", MEM,
               hf_files({"num_hidden_layers": Raw("9" * 5000)}))

    nonfinite = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}
    cluster = cluster_table()
    cluster_keys = [*_rate_keys(cluster), "host.nvme_bandwidth_GBps"]   # nvme: optional, absent here
    gpu_keys = list(_rate_keys(repo_toml("hardware/gpus/a100-sxm4-80g.toml")))
    for key in cluster_keys:
        for text, value in nonfinite.items():
            yield Case(f"parser-bomb/hardware-{text}/cluster.{key}", RUN,
                       cluster_files({key: value}, table=OFFLOAD_2NODES), mentions=(key.split(".")[-1],))
    for key in gpu_keys:
        for text, value in nonfinite.items():
            yield Case(f"parser-bomb/hardware-{text}/gpu.{key}", RUN,
                       cluster_files(gpu_changes={key: value}, table=OFFLOAD_2NODES), mentions=(key,))
    for text, value in nonfinite.items():
        yield Case(f"parser-bomb/comm-busbw-{text}/comm.busbw_GBps.dp", RUN,
                   scenario_files(OFFLOAD_2NODES, {"comm.busbw_GBps": {"dp": value}}), mentions=("busbw_GBps",))

    for literal in ("NaN", "Infinity", "1e400"):
        yield Case(f"parser-bomb/json-{literal}/ds.zero_optimization.reduce_bucket_size", RUN,
                   ds_files({"zero_optimization.reduce_bucket_size": Raw(literal)}), mentions=("reduce_bucket_size",))
        yield Case(f"parser-bomb/json-{literal}/hf.hidden_size", MEM, hf_files({"hidden_size": Raw(literal)}),
                   mentions=("hidden_size",))


# ---------------------------------------------------------------------------------------------
# 3. Type confusion


def type_confusion_cases() -> Iterator[Case]:
    hf: list[tuple[str, Any]] = [
        ("num_key_value_heads", "8"), ("head_dim", "128"), ("num_hidden_layers", 2.5), ("num_hidden_layers", True),
        ("tie_word_embeddings", "no"), ("tie_word_embeddings", 1)]
    for key, value in hf:
        yield Case(f"type-confusion/hf.{key}={json.dumps(value)}", MEM, hf_files({key: value}), mentions=(key,))
    yield Case("type-confusion/hf.num_key_value_heads=null", MEM, hf_files({"num_key_value_heads": None}), ANSWER)
    yield Case("type-confusion/hf-gpt2.n_inner=null", MEM, hf_files({"n_inner": None}, "gpt2-hf"), ANSWER)
    yield Case("type-confusion/hf.top-level-array", MEM, scenario_files(
        BASE, {"model": "config.json"}, others={"config.json": "[]\n"}), mentions=("config.json",))
    yield Case("type-confusion/hf.model_type=bert", MEM, hf_files({"model_type": "bert"}), mentions=("model_type",))

    ds: list[tuple[str, Any]] = [
        ("activation_checkpointing.partition_activations", "no"), ("zero_optimization.stage", "3"),
        ("zero_optimization.overlap_comm", 1), ("bf16.enabled", 1), ("train_batch_size", "64"), ("fp16", True),
        ("gradient_accumulation_steps", 2.5)]
    for key, value in ds:
        yield Case(f"type-confusion/ds.{key}={json.dumps(value)}", MEM, ds_files({key: value}),
                   mentions=("ds.json", key.split(".")[-1]))
    yield Case("type-confusion/ds.top-level-null", MEM, scenario_files(DS_BASE, others={"ds.json": "null\n"}),
               mentions=("ds.json",))

    scenario: list[tuple[str, Any]] = [
        ("nodes", "1"), ("nodes", 1.5), ("nodes", True), ("zero.stage", "3"), ("zero.overlap_comm", 1),
        ("parallel.sequence_parallel", 1), ("training.precision", 16), ("training.recompute", True), ("model", 7),
        ("cluster", ["dgx-a100-80g"]), ("zero.offload_optimizer", True), ("training", "seq_len 2048")]
    for key, value in scenario:
        yield Case(f"type-confusion/scenario.{key}={json.dumps(value)}", MEM, scenario_files(BASE, {key: value}),
                   mentions=(key.split(".")[-1],))
    yield Case("type-confusion/scenario.zero.stage=2.0", MEM, scenario_files(BASE, {"zero.stage": 2.0}), EITHER)
    yield Case("type-confusion/scenario.training.seq_len=2048.0", MEM,
               scenario_files(BASE, {"training.seq_len": 2048.0}), EITHER)

    model: list[tuple[str, Any]] = [("gated_mlp", 1), ("tied_embeddings", "no"), ("layers", "32")]
    for key, value in model:
        yield Case(f"type-confusion/model.{key}={json.dumps(value)}", MEM, model_files({key: value}), mentions=(key,))
    for key, value in [("gpus_per_node", "8"), ("intra_node.bandwidth_GBps", "300")]:
        yield Case(f"type-confusion/cluster.{key}={json.dumps(value)}", MEM, cluster_files({key: value}),
                   mentions=(key.split(".")[-1],))


# ---------------------------------------------------------------------------------------------
# 4. Nonsense values


def nonsense_cases() -> Iterator[Case]:
    for key, value in [("num_key_value_heads", -8), ("num_key_value_heads", 0), ("head_dim", -128),
                       ("hidden_size", 0), ("num_key_value_heads", 5)]:
        yield Case(f"nonsense/hf.{key}={value}", MEM, hf_files({key: value}), mentions=(key,))
    yield Case("nonsense/hf-gpt2.n_inner=-5", MEM, hf_files({"n_inner": -5}, "gpt2-hf"), mentions=("n_inner",))

    scenario: list[tuple[str, Any]] = [
        ("nodes", 0), ("training.micro_batch", -1), ("training.micro_batch", 0), ("parallel.tp", 0),
        ("parallel.dp", 0), ("training.seq_len", -1), ("gpus_per_node", 16), ("zero.stage", 4),
        ("training.precision", "fp8"), ("training.recompute", "sometimes"), ("engine", "megatron"),
        ("schedule", "bogus"), ("comm.algorithm", "bogus"), ("nodez", 1), ("zero.stagee", 2)]
    for key, value in scenario:
        yield Case(f"nonsense/scenario.{key}={value}", MEM, scenario_files(BASE, {key: value}),
                   mentions=(key.split(".")[-1],))

    yield Case("nonsense/tp-not-dividing-heads", MEM,
               scenario_files(BASE, {"model": "qwen2-7b", "parallel.tp": 8, "training.global_batch": 4}),
               mentions=("heads",))
    yield Case("nonsense/tp-not-dividing-kv-heads", MEM,
               scenario_files(ZERO3_H100X2, {"model": "mixtral-8x7b", "zero.stage": 1, "parallel.tp": 16,
                                             "training.global_batch": 4}), mentions=("heads",))
    yield Case("nonsense/pp-not-dividing-layers", MEM,
               scenario_files(BASE, {"gpus_per_node": 6, "parallel.pp": 3, "zero.stage": 1}), mentions=("pp",))
    yield Case("nonsense/sequence-parallel-without-tp", MEM,
               scenario_files(BASE, {"parallel.sequence_parallel": True}), mentions=("sequence_parallel",))
    yield Case("nonsense/zero2-with-pp2", MEM, scenario_files(BASE, {"parallel.pp": 2, "training.global_batch": 8}))
    yield Case("nonsense/bf16-on-v100", MEM, scenario_files(BASE, {"cluster": "dgx1-v100"}), mentions=("bf16",))
    yield Case("nonsense/gpt2-seq-len-beyond-positions", MEM,
               scenario_files(BASE, {"model": "gpt2", "training.seq_len": 4096}), mentions=("seq_len",))
    yield Case("nonsense/fsdp-replicate-degree-3", MEM,
               scenario_files(repo_toml(FSDP_SCENARIO), {"fsdp.replicate_degree": 3}), mentions=("replicate_degree",))
    yield Case("nonsense/batch-global!=micro*accum*dp", MEM,
               scenario_files(BASE, {"training.global_batch": 50, "training.micro_batch": 2, "training.grad_accum": 3}),
               mentions=("batch",))
    yield Case("nonsense/batch-global-not-divisible", MEM,
               scenario_files(BASE, {"training.global_batch": 50, "training.micro_batch": 2}), mentions=("batch",))
    yield Case("nonsense/ds.train_batch_size!=micro*accum*dp", MEM, ds_files({"train_batch_size": 100}),
               mentions=("ds.json", "train_batch_size"), forbids=("training.global_batch",))
    yield Case("nonsense/ds-vs-scenario-micro-batch", MEM, ds_files({}, {"training.micro_batch": 4}),
               mentions=("micro",))
    yield Case("nonsense/ds.fp16-and-bf16", MEM, ds_files({"fp16": {"enabled": True}}), mentions=("ds.json",))
    yield Case("nonsense/ds.optimizer=SGD", MEM, ds_files({"optimizer.type": "SGD"}), mentions=("ds.json",))
    yield Case("nonsense/ds.unknown-key", MEM, ds_files({"zero_optimisation": {"stage": 2}}),
               mentions=("zero_optimisation",))

    for key, value in [("layers", 0), ("kv_heads", 5), ("hidden", 4097)]:
        yield Case(f"nonsense/model.{key}={value}", MEM, model_files({key: value}), mentions=(key,))
    yield Case("nonsense/model.experts_per_token>experts", MEM,
               model_files({"experts": 2, "experts_per_token": 3}, "mixtral-8x7b"), mentions=("experts",))
    yield Case("nonsense/model.missing-vocab", MEM, model_files({"vocab": DELETE}), mentions=("vocab",))

    cluster: list[tuple[str, Any]] = [("intra_node.efficiency", 1.5), ("inter_node.nic_bandwidth_Gbps", -200),
                                      ("intra_node.latency_us", -1), ("intra_node.topology", "bogus")]
    for key, value in cluster:
        yield Case(f"nonsense/cluster.{key}={value}", RUN, cluster_files({key: value}), mentions=(key.split(".")[-1],))
    yield Case("nonsense/gpu.memory_GiB=0", MEM, cluster_files(gpu_changes={"memory_GiB": 0}), mentions=("memory_GiB",))


# ---------------------------------------------------------------------------------------------
# 5. Work bombs: refuse quickly or answer quickly; a hang is broken


def work_bomb_cases() -> Iterator[Case]:
    huge_model = edited(BASE, {"model": {**LLAMA_DIMS, "layers": 1_000_000_000}})
    many_nodes = edited(BASE, {"nodes": 10_000_000, "training.global_batch": DELETE, "training.grad_accum": 1})
    moe = edited(ZERO3_H100X2, {"model": {**MIXTRAL_DIMS, "experts": 1_000_000}})
    fsdp = repo_toml(FSDP_SCENARIO)
    for command, argv in (("memory", MEM), ("run", RUN)):
        yield Case(f"work-bomb/layers-1e9/{command}", argv, scenario_files(huge_model), EITHER)
        yield Case(f"work-bomb/nodes-1e7/{command}", argv, scenario_files(many_nodes), EITHER)
        yield Case(f"work-bomb/moe-experts-1e6/{command}", argv, scenario_files(moe), EITHER)
    yield Case("work-bomb/grad-accum-1e9-via-global-batch", RUN,
               scenario_files(BASE, {"training.global_batch": 8_000_000_000}), EITHER)
    yield Case("work-bomb/grad-accum-1e9-via-ds-config", RUN,
               ds_files({"gradient_accumulation_steps": 1_000_000_000}), EITHER)
    yield Case("work-bomb/seq-len-1e9", RUN, scenario_files(BASE, {"training.seq_len": 1_000_000_000}), EITHER)
    yield Case("work-bomb/run-steps-1e9", ("run", "--json", "--steps", "1000000000", "s.toml"),
               scenario_files(BASE), EITHER)
    yield Case("work-bomb/fsdp-forward-prefetch-1e9", RUN,
               scenario_files(fsdp, {"fsdp.forward_prefetch": 1_000_000_000}), EITHER)
    yield Case("work-bomb/fsdp-backward-prefetch-1e9", RUN,
               scenario_files(fsdp, {"fsdp.backward_prefetch": 1_000_000_000}), EITHER)
    yield Case("work-bomb/validate-profile-dir-missing", ("validate", "--profile-dir", "/no/such/dir"),
               mentions=("--profile-dir",), timeout_s=TORCH_TIMEOUT_S)


# ---------------------------------------------------------------------------------------------
# 6. Command-line flags: each must be refused with one line (argparse's usage block is broken)


def cli_flag_cases() -> Iterator[Case]:
    quick = {"--params": "7.5e9", "--dp": "64", "--gpu-memory": "32GB"}

    def memory_quick(flag: str, value: str) -> tuple[str, ...]:
        flags = {**quick, flag: value}
        return ("memory", "--json", *[x for pair in flags.items() for x in pair])

    bad = [("--params", "."), ("--params", "1.2.3B"), ("--params", "1e400"), ("--params", "-5"), ("--params", "nan"),
           ("--gpu-memory", "0GB"), ("--gpu-memory", "-1GB"), ("--gpu-memory", "1e400GB"), ("--k", "-20"),
           ("--k", "nan"), ("--k", "inf"), ("--dp", "0"), ("--dp", "10000000000000"),
           ("--largest-module", "20B")]
    for flag, value in bad:
        yield Case(f"cli-flag/memory{flag}={value}", memory_quick(flag, value), mentions=(flag,))
    # K = 0 is a real optimizer (plain SGD keeps no state): answered
    yield Case("cli-flag/memory--k=0", memory_quick("--k", "0"), expect=ANSWER)
    for value in ("nan", "2"):
        yield Case(f"cli-flag/memory--fragmentation={value}", ("memory", "--json", "--fragmentation", value, "s.toml"),
                   scenario_files(BASE), mentions=("--fragmentation",))
    yield Case("cli-flag/memory-scenario-and-params", ("memory", "--json", "--params", "7B", "s.toml"),
               scenario_files(BASE), mentions=("command line",))
    yield Case("cli-flag/memory-neither-scenario-nor-params", ("memory",), mentions=("command line",))
    yield Case("cli-flag/memory-scenario-with-gpu-memory", ("memory", "--gpu-memory", "32GB", "s.toml"),
               scenario_files(BASE), mentions=("--gpu-memory",))

    for value in ("0", "-1", "1e9"):
        yield Case(f"cli-flag/run--steps={value}", ("run", "--steps", value, "s.toml"), scenario_files(BASE),
                   mentions=("--steps",))
    yield Case("cli-flag/run--mode=bogus", ("run", "--mode", "bogus", "s.toml"), scenario_files(BASE),
               mentions=("--mode",))
    yield Case("cli-flag/run-unknown-flag", ("run", "--bogus", "s.toml"), scenario_files(BASE), mentions=("--bogus",))
    yield Case("cli-flag/run-missing-scenario", ("run",), mentions=("scenario",))
    yield Case("cli-flag/unknown-subcommand", ("bogus",), mentions=("bogus",))
    yield Case("cli-flag/no-subcommand", (), mentions=("command",))

    calibrate = [("--worlds", "0"), ("--worlds", "-2"), ("--max-size-MiB", "-1"), ("--max-size-MiB", "nan"),
                 ("--device", "bogus")]
    for flag, value in calibrate:
        yield Case(f"cli-flag/calibrate{flag}={value}", ("calibrate", "--out", "out", flag, value),
                   mentions=(flag,), timeout_s=TORCH_TIMEOUT_S)
    yield Case("cli-flag/calibrate--peak-TFLOPS=-1", ("calibrate", "--out", "out", "--device", "cpu",
                                                       "--peak-TFLOPS", "-1"),
               mentions=("--peak-TFLOPS",), timeout_s=TORCH_TIMEOUT_S)
    for value in ("0", "1000"):
        yield Case(f"cli-flag/validate--worlds={value}", ("validate", "--worlds", value), mentions=("--worlds",),
                   timeout_s=TORCH_TIMEOUT_S)


# ---------------------------------------------------------------------------------------------
# 7. Output paths that cannot be written: refuse before printing the result


def output_path_cases() -> Iterator[Case]:
    outputs = [("run", "--trace", "json"), ("run", "--events", "csv"), ("memory", "--plot", "png")]
    for command, flag, ext in outputs:
        places: list[tuple[str, str, dict[str, FileContent], bool]] = [   # variant, path, files, needs non-root
            ("missing-folder", f"no/such/folder/out.{ext}", {}, False),
            ("existing-directory", f"out.{ext}", {f"out.{ext}": DIR}, False),
            ("parent-is-a-file", f"afile/out.{ext}", {"afile": "not a folder\n"}, False),
            ("read-only-folder", f"ro/out.{ext}", {"ro": READONLY_DIR}, True),
        ]
        for variant, path, files, non_root in places:
            yield Case(f"output-path/{command}{flag}/{variant}", (command, flag, path, "s.toml"),
                       scenario_files(BASE, others=files), mentions=(flag,), stdout_empty=True, needs_non_root=non_root)
    yield Case("output-path/memory--plot/unknown-format", ("memory", "--plot", "out.bogus", "s.toml"),
               scenario_files(BASE), mentions=("--plot",), stdout_empty=True)


# ---------------------------------------------------------------------------------------------
# 8. Keys accepted but not simulated: refuse with "not simulated yet"; and one host-memory answer


def not_simulated_cases() -> Iterator[Case]:
    nvme_base = edited(ZERO3_H100X2, {"cluster": "dgx2", "training.precision": "fp16"})   # DGX-2 has NVMe
    scenarios = {
        "zero_quantized_nontrainable_weights": scenario_files(ZERO3_H100X2, {
            "zero.zero_quantized_nontrainable_weights": True}),
        "zero_hpz_partition_size=4": scenario_files(ZERO3_H100X2, {"zero.zero_hpz_partition_size": 4}),
        "offload_optimizer-cpuadam_cores_perc": scenario_files(nvme_base, {"zero.offload_optimizer": {
            "device": "cpu", "cpuadam_cores_perc": 0.5}}),
        "offload_param-max_in_cpu": scenario_files(nvme_base, {"zero.offload_param": {
            "device": "cpu", "max_in_cpu": 1000}}),
        "offload_optimizer-cpu-super_offload": scenario_files(ZERO3_H100X2, {"zero.offload_optimizer": {
            "device": "cpu", "super_offload": True}}),
        "schedule-paper-with-cpu-offload": scenario_files(ZERO3_H100X2, {"schedule": "paper",
                                                                        "zero.offload_optimizer": "cpu"}),
    }
    for what, files in scenarios.items():
        for command, argv in (("memory", MEM), ("run", RUN)):
            yield Case(f"not-simulated/{what}/{command}", argv, files, mentions=("not simulated yet",))
    ds_zero3 = edited(DS_BASE, {"cluster": "dgx-h100", "nodes": 2})
    yield Case("not-simulated/ds.zero_quantized_nontrainable_weights/run", RUN,
               ds_files({"zero_optimization.stage": 3, "zero_optimization.zero_quantized_nontrainable_weights": True},
                        table=ds_zero3), mentions=("not simulated yet", "ds.json"))
    yield Case("not-simulated/ds.offload_optimizer-fast_init/run", RUN,   # DGX-2: V100s, so fp16
               ds_files({"zero_optimization.offload_optimizer": {"device": "nvme", "nvme_path": "/tmp",
                                                                 "fast_init": True},
                         "bf16.enabled": False, "fp16": {"enabled": True}},
                        table=edited(ds_zero3, {"cluster": "dgx2"})), mentions=("not simulated yet", "ds.json"))

    # Llama-3.1-405B, ZeRO-3 + CPU optimizer offload on one DGX H100 (2 TiB of host DRAM): the
    # offloaded states (~0.9 TB per GPU, 8 GPUs) cannot fit in host memory. With offload_param
    # as well the GPUs hold little, so there only the host accounting can say "does not fit".
    llama405 = edited(ZERO3_H100X2, {"model": "llama3-405b", "nodes": 1, "training.global_batch": 8,
                                     "zero.offload_optimizer": "cpu"})
    for command in ("memory", "run"):
        yield Case(f"not-simulated/llama3-405b-offload-host-memory/{command}-json", (command, "--json", "s.toml"),
                   scenario_files(llama405), EXIT3)
        yield Case(f"not-simulated/llama3-405b-offload-host-memory/{command}-text", (command, "s.toml"),
                   scenario_files(llama405), EXIT3)
        yield Case(f"not-simulated/llama3-405b-offload-optimizer-and-param-host-memory/{command}-json",
                   (command, "--json", "s.toml"), scenario_files(llama405, {"zero.offload_param": "cpu"}), EXIT3)


# ---------------------------------------------------------------------------------------------
# 9. Random mutations of the bundled scenarios (deterministic: random.Random(0))


def _paths(table: dict[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for key, value in table.items():
        yield (*prefix, key)
        if isinstance(value, dict):
            yield from _paths(value, (*prefix, key))


def _category(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "negative int" if value < 0 else "huge int" if value > 2**63 else "int"
    return {str: "string", float: "float", dict: "empty table", list: "list"}.get(type(value), "other")


RANDOM_VALUES: dict[str, Callable[[random.Random], Any]] = {
    "string": lambda rng: rng.choice(["bogus", "", "1", "auto", "none", "ünïcode"]),
    "negative int": lambda rng: -rng.randint(1, 1000),
    "float": lambda rng: rng.choice([0.5, 1e-9, 2.5, 3.0e12, -1.5]),
    "bool": lambda rng: rng.choice([True, False]),
    "empty table": lambda rng: {},
    "huge int": lambda rng: 10**30,
}


def misspell(word: str, rng: random.Random) -> str:
    i = rng.randrange(len(word))
    kind = rng.choice(["drop", "double", "swap", "upper"])
    if kind == "drop" and len(word) > 1:
        return word[:i] + word[i + 1:]
    if kind == "swap" and i + 1 < len(word) and word[i] != word[i + 1]:
        return word[:i] + word[i + 1] + word[i] + word[i + 2:]
    if kind == "upper" and word[i].islower():
        return word[:i] + word[i].upper() + word[i + 1:]
    return word[:i] + word[i] + word[i:]


def mutate(table: dict[str, Any], rng: random.Random) -> tuple[dict[str, Any], str]:
    """One random change: delete a key, give it a value of another type, or misspell it."""
    result = copy.deepcopy(table)
    path = rng.choice(sorted(_paths(result)))
    parent = result
    for part in path[:-1]:
        parent = parent[part]
    key = path[-1]
    operation = rng.choice(["delete", "retype", "misspell"])
    dotted = ".".join(path)
    if operation == "delete":
        del parent[key]
        return result, f"delete-{dotted}"
    if operation == "retype":
        kind = rng.choice(sorted(k for k in RANDOM_VALUES if k != _category(parent[key])))
        parent[key] = RANDOM_VALUES[kind](rng)
        return result, f"{dotted}={kind.replace(' ', '-')}"
    new = misspell(key, rng)
    parent[new] = parent.pop(key)
    return result, f"rename-{dotted}-to-{new}"


def mutation_cases(per_scenario: int = 5) -> Iterator[Case]:
    rng = random.Random(0)
    companions = {p.name: p.read_text(encoding="utf-8") for p in sorted((ROOT / "scenarios").glob("*.json"))}
    for path in sorted((ROOT / "scenarios").glob("*.toml")):
        original = tomllib.loads(path.read_text(encoding="utf-8"))
        for i in range(per_scenario):
            mutated, what = mutate(original, rng)
            argv = MEM if i % 2 == 0 else RUN
            yield Case(f"mutation/{path.stem}/{i}:{what}", argv, {"s.toml": toml_text(mutated), **companions}, EITHER)


def build_corpus() -> list[Case]:
    corpus = [*control_cases(), *unreadable_cases(), *parser_bomb_cases(), *type_confusion_cases(),
              *nonsense_cases(), *work_bomb_cases(), *cli_flag_cases(), *output_path_cases(), *not_simulated_cases(),
              *mutation_cases()]
    ids = [case.id for case in corpus]
    duplicates = {i for i in ids if ids.count(i) > 1}
    assert not duplicates, f"duplicate case ids: {sorted(duplicates)}"
    return corpus


# ---------------------------------------------------------------------------------------------
# Running one case


@dataclass
class Run:
    rc: int | None
    stdout: str
    stderr: str
    seconds: float
    stopped: str | None = None     # why the audit killed it: a hang or runaway resources


def zerosim_command() -> list[str]:
    """The installed `zerosim` beside this interpreter, else on PATH, else `python -m sim.cli`."""
    beside = Path(sys.executable).parent / "zerosim"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("zerosim")
    return [found] if found else [sys.executable, "-m", "sim.cli"]


def _cap_address_space() -> None:
    """preexec_fn: runs in the child between fork and exec; only a setrlimit call, nothing else."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def session_usage(session: int) -> tuple[int, int]:
    """(processes, resident bytes) of a session, from /proc; (0, 0) where there is no /proc."""
    count = rss = 0
    try:
        entries = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return 0, 0
    for pid in entries:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == session:          # field 6 of stat: the session id
            count += 1
            rss += int(fields[21]) * PAGE_SIZE  # field 24: resident pages
    return count, rss


def _kill_group(pgid: int) -> None:
    """Kill the process group this audit started (the child leads its own session)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _watch(proc: subprocess.Popen[bytes], limit_s: float, start: float) -> tuple[bytes, bytes, str | None]:
    """Wait for the child, killing its group on a hang or on runaway processes or memory."""
    while True:
        try:
            out, err = proc.communicate(timeout=POLL_S)
            return out, err, None
        except subprocess.TimeoutExpired:
            pass
        stopped = None
        if time.monotonic() - start > limit_s:
            stopped = f"hang: no exit after {limit_s:g} s"
        else:
            processes, rss = session_usage(proc.pid)
            if processes > MAX_PROCESSES:
                stopped = f"runaway: {processes} processes (cap {MAX_PROCESSES})"
            elif rss > MEMORY_CAP:
                stopped = f"runaway: {rss / 2**30:.1f} GiB resident (cap {MEMORY_CAP / 2**30:g} GiB)"
        if stopped:
            _kill_group(proc.pid)
            try:
                out, err = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = b"", b""
            return out, err, stopped


def _make_removable(folder: Path) -> None:
    for dirpath, dirnames, _ in os.walk(folder):
        for name in dirnames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                os.chmod(path, 0o755)


def execute(case: Case, command: list[str], timeout_s: float) -> Run:
    folder = Path(tempfile.mkdtemp(prefix="zerosim-hostile-"))
    try:
        materialise(folder, case.files)
        env = dict(os.environ, HOME=str(folder), TMPDIR=str(folder))
        start = time.monotonic()
        proc = subprocess.Popen([*command, *case.argv], cwd=folder, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                preexec_fn=_cap_address_space)  # noqa: PLW1509 (only a setrlimit call)
        out, err, stopped = _watch(proc, case.timeout_s or timeout_s, start)
        if session_usage(proc.pid)[0]:
            _kill_group(proc.pid)              # workers the command left behind
        return Run(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"),
                   time.monotonic() - start, stopped)
    finally:
        _make_removable(folder)
        shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Judging one outcome against the contract


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _host_numbers(node: Any) -> bool:
    """Whether a JSON result holds a positive finite number under a key naming host memory."""
    if isinstance(node, dict):
        return any((("host" in k.lower()) and isinstance(v, (int, float)) and not isinstance(v, bool)
                    and math.isfinite(v) and v > 0) or _host_numbers(v) for k, v in node.items())
    if isinstance(node, list):
        return any(_host_numbers(v) for v in node)
    return False


def refusal_problems(case: Case, run: Run) -> list[str]:
    lines = run.stderr.rstrip("\n").split("\n")
    message = lines[0]
    problems = []
    if len(lines) != 1 or not message.strip():
        problems.append(f"refusal is {len(lines)} lines of stderr, not one")
    if not message.startswith(PREFIX):
        problems.append(f"refusal does not start with {PREFIX!r}")
    elif "command line" not in message and ".toml" not in message and ".json" not in message:
        problems.append("refusal names no file and not 'command line'")
    missing = [m for m in case.mentions if m not in run.stderr]
    if missing:
        problems.append(f"refusal does not mention {', '.join(map(repr, missing))}")
    present = [f for f in case.forbids if f in run.stderr]
    if present:
        problems.append(f"refusal mentions {', '.join(map(repr, present))}")
    if case.stdout_empty and run.stdout.strip():
        problems.append("printed the result before refusing the output path")
    return problems


def answer_problems(case: Case, run: Run) -> list[str]:
    problems = []
    if case.expect == REFUSE:
        problems.append(f"accepted nonsense (exit {run.rc})")
    if case.expect == EXIT3 and run.rc != 3:
        problems.append("exit 0: should not fit (host memory)")
    parsed = None
    if "--json" in case.argv:
        try:
            parsed = json.loads(run.stdout, parse_constant=_reject_constant)
        except ValueError as error:
            problems.append(f"stdout is not strict JSON: {str(error)[:80]}")
    if case.expect == EXIT3:
        shown = _host_numbers(parsed) if "--json" in case.argv else bool(HOST_WORD.search(run.stdout))
        if not shown:
            problems.append("no host memory numbers in the output")
    return problems


def judge(case: Case, run: Run) -> list[str]:
    """The contract's broken rules for this outcome; empty when it keeps the contract."""
    if run.stopped:
        return [run.stopped]
    problems = []
    if run.rc is not None and run.rc < 0:
        problems.append(f"killed by {signal.Signals(-run.rc).name}")
    elif run.rc not in (0, 2, 3):
        problems.append(f"exit status {run.rc}")
    if "Traceback" in run.stderr:
        problems.append("Traceback")
    if "MemoryError" in run.stderr:
        problems.append(f"MemoryError under the {MEMORY_CAP // 2**30} GiB cap")
    if run.rc == 2:
        if case.expect in (ANSWER, EXIT3):
            problems.append("refused a valid input")
        problems += refusal_problems(case, run)
    elif run.rc in (0, 3):
        problems += answer_problems(case, run)
    return problems


def describe(run: Run) -> str:
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    if run.stopped:
        what = run.stopped
    elif "Traceback" in run.stderr:
        what = f"Traceback: {lines[-1] if lines else ''}"
    else:
        what = f"exit {run.rc}: {lines[0] if lines else '(no stderr)'}"
    return what if len(what) <= 200 else what[:197] + "..."


# ---------------------------------------------------------------------------------------------
# The audit


@dataclass
class Outcome:
    case: Case
    run: Run | None
    problems: list[str]
    skipped: str | None = None

    @property
    def status(self) -> str:
        return "skipped" if self.skipped else "broken" if self.problems else "ok"

    def to_json(self) -> dict[str, Any]:
        run = self.run
        return {"id": self.case.id, "class": self.case.klass, "argv": list(self.case.argv),
                "expect": self.case.expect, "status": self.status, "problems": self.problems,
                "skipped": self.skipped, "exit": run.rc if run else None,
                "seconds": round(run.seconds, 2) if run else None, "stopped": run.stopped if run else None,
                "stderr": run.stderr[-2000:] if run else None, "stdout_head": run.stdout[:500] if run else None}


def assess(case: Case, command: list[str], timeout_s: float) -> Outcome:
    if case.needs_non_root and os.geteuid() == 0:
        return Outcome(case, None, [], skipped="running as root: permission checks do not apply")
    try:
        run = execute(case, command, timeout_s)
    except OSError as error:     # the case's files could not be made here (e.g. no FIFOs)
        return Outcome(case, None, [], skipped=f"setup failed: {error}")
    return Outcome(case, run, judge(case, run))


def summary_table(outcomes: Iterable[Outcome]) -> str:
    counts = {k: {"cases": 0, "ok": 0, "broken": 0, "skipped": 0} for k in CLASSES}
    for outcome in outcomes:
        row = counts.setdefault(outcome.case.klass, {"cases": 0, "ok": 0, "broken": 0, "skipped": 0})
        row["cases"] += 1
        row[outcome.status] += 1
    total = {k: sum(row[k] for row in counts.values()) for k in ("cases", "ok", "broken", "skipped")}
    lines = [f"{'class':16s}{'cases':>7s}{'ok':>7s}{'broken':>8s}{'skipped':>9s}"]
    for name, row in [*counts.items(), ("total", total)]:
        if row["cases"]:
            lines.append(f"{name:16s}{row['cases']:7d}{row['ok']:7d}{row['broken']:8d}{row['skipped']:9d}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", metavar="SUBSTRING", help="run only the cases whose id contains this")
    parser.add_argument("--jobs", type=int, default=2, help="cases run at once (2-4; default 2)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                        help=f"per-case timeout in seconds (default {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--json", metavar="OUT.json", help="also write every outcome to this file")
    parser.add_argument("--list", action="store_true", help="list the case ids and exit")
    parser.add_argument("--zerosim", metavar="COMMAND", help="the command to audit, e.g. 'python -m sim.cli' "
                        "(default: the zerosim installed beside this interpreter, else on PATH)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    corpus = [case for case in build_corpus() if args.only in case.id]
    if args.list:
        print("\n".join(f"{case.id}  [{case.expect}] zerosim {' '.join(case.argv)[:120]}" for case in corpus))
        return 0
    command = shlex.split(args.zerosim) if args.zerosim else zerosim_command()
    progress = sys.stderr.isatty()
    outcomes: list[Outcome] = []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for outcome in pool.map(lambda case: assess(case, command, args.timeout), corpus):
            outcomes.append(outcome)
            if progress:
                print(f"\r{len(outcomes)}/{len(corpus)} cases", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)

    for outcome in outcomes:
        if outcome.status == "broken":
            assert outcome.run is not None
            print(f"BROKEN {outcome.case.id} [{outcome.case.expect}]: {'; '.join(outcome.problems)} "
                  f"| {describe(outcome.run)}")
    print()
    print(summary_table(outcomes))
    if args.json:
        Path(args.json).write_text(json.dumps([o.to_json() for o in outcomes], indent=2) + "\n", encoding="utf-8")
    return 1 if any(o.status == "broken" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
