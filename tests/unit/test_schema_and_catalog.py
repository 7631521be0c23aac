"""Strict table reading, unit conversion, catalog resolution, and the hardware catalog."""

from __future__ import annotations

import ast

import pytest

from sim.core.errors import InputError
from sim.inputs.catalog import catalog_names, resolve
from sim.inputs.hardware import load_cluster
from sim.inputs.schema import Key, read_table
from tests.conftest import HARDWARE, ROOT

KEYS = (Key("bandwidth_GBps", float, positive=True), Key("latency_us", float, required=False, default=0.0),
        Key("mode", str, required=False, default="a", choices=("a", "b")))


def test_units_are_converted_once_to_si():
    v = read_table({"bandwidth_GBps": 25, "latency_us": 3.4}, KEYS, "f.toml")
    assert v == {"bandwidth": 25e9, "latency": pytest.approx(3.4e-6), "mode": "a"}


@pytest.mark.parametrize(("table", "key", "words"), [
    ({"bandwidth_GBps": 1, "bandwith_GBps": 2}, "bandwith_GBps", "unknown key"),
    ({}, "bandwidth_GBps", "missing required key; allowed: a number > 0"),
    ({"bandwidth_GBps": "fast"}, "bandwidth_GBps", "allowed: a number"),
    ({"bandwidth_GBps": True}, "bandwidth_GBps", "allowed: a number"),
    ({"bandwidth_GBps": -1}, "bandwidth_GBps", "got -1.0; allowed: a number > 0"),
    ({"bandwidth_GBps": 1, "mode": "c"}, "mode", "allowed: a, b"),
])
def test_bad_tables_name_file_key_and_problem(table, key, words):
    with pytest.raises(InputError) as e:
        read_table(table, KEYS, "f.toml", "link.")
    assert e.value.source == "f.toml" and e.value.key == f"link.{key}" and words in str(e.value)


def test_unknown_catalog_name_lists_the_allowed_names():
    with pytest.raises(InputError) as e:
        resolve("dgx-z100", "hardware", ROOT, "s.toml", "cluster")
    assert "dgx-a100-80g" in str(e.value) and e.value.key == "cluster"


@pytest.mark.parametrize("name", catalog_names("hardware"))
def test_every_cluster_loads_with_sane_numbers(name):
    c = load_cluster(HARDWARE / f"{name}.toml")
    assert c.gpu.memory > 1e9 and c.node.intra_node.bandwidth > 0 and c.host.cpu_adam_params_per_s > 0
    assert 0 < c.node.intra_node.efficiency <= 1 and 0 < c.inter_node.efficiency <= 1
    # defaults are SI like the file values (a file without nvme_latency_us once got 100 s)
    assert 1e-6 < c.host.nvme_latency < 1e-2 and 1e8 < c.host.fresh_pageable_d2h < 1e11


def test_required_clusters_are_in_the_catalog():
    names = set(catalog_names("hardware"))
    assert {"dgx1-v100", "dgx2", "dgx-a100-40g", "dgx-a100-80g", "dgx-h100", "hgx-h200", "dgx-b200",
            "local-cpu"} <= names


def test_dgx2_and_dgx_h100_facts():
    dgx2 = load_cluster(HARDWARE / "dgx2.toml")
    assert dgx2.gpus_per_node == 16 and dgx2.node.nics_per_node == 8
    assert dgx2.inter_node.bandwidth == pytest.approx(12.5e9)  # 100 Gb/s EDR
    assert dgx2.gpu.bf16_flops == 0 and dgx2.gpu.fp16_flops == 125e12
    h100 = load_cluster(HARDWARE / "dgx-h100.toml")
    assert h100.inter_node.bandwidth == pytest.approx(50e9) and h100.gpu.bf16_flops == 989e12


def test_b200_marks_its_uncertain_figures():
    b200 = load_cluster(HARDWARE / "dgx-b200.toml")
    assert "bf16_TFLOPS" in b200.gpu.uncertain and "intra_node.efficiency" in b200.uncertain


def test_every_number_in_the_hardware_catalog_carries_a_source_comment():
    # House rule: each constant has its source (or "estimate"/"placeholder") beside it.
    for path in HARDWARE.rglob("*.toml"):
        for line in path.read_text().splitlines():
            stripped = line.strip()
            if "=" in stripped and not stripped.startswith("#") and stripped.split("=")[1].strip()[:1].isdigit():
                key = stripped.split("=")[0].strip()
                assert "#" in stripped, f"{path.name}: {key} has no source comment"


def test_analytic_twin_never_imports_simpy():
    for path in (ROOT / "sim" / "analytic").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not any(n.split(".")[0] == "simpy" for n in names), path
