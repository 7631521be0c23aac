"""Hardware catalog loading: GPU and cluster TOML files (or inline tables) -> specs.

File format: see docs/scenarios.md ("Hardware files"). Every key is required unless
marked optional below; units are in the key suffix and converted here, once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sim.core import limits as L
from sim.core.errors import InputError
from sim.core.specs import ClusterSpec, GpuSpec, HostSpec, IntraNodeTopology, LinkSpec, NodeSpec
from sim.core.units import GB, US
from sim.inputs.calibration_table import read_calibration
from sim.inputs.catalog import resolve
from sim.inputs.reading import read_toml
from sim.inputs.schema import Key, read_table

GPU_KEYS = (
    Key("name", str),
    Key("memory_GiB", float, positive=True),
    Key("memory_bandwidth_GBps", float, positive=True),
    Key("bf16_TFLOPS", float, non_negative=True),
    Key("fp16_TFLOPS", float, positive=True),
    Key("fp32_TFLOPS", float, positive=True),
    Key("fp8_TFLOPS", float, required=False, default=0.0, non_negative=True),
    Key("matmul_efficiency", float, fraction=True),
    Key("memory_bandwidth_efficiency", float, fraction=True),
    Key("uncertain", list, required=False, default=[]),
    Key("kernel_overhead_us", float, required=False, default=0.0, non_negative=True),
    Key("sm_count", int, required=False, default=0, non_negative=True, maximum=100_000),
    Key("attention_efficiency", float, required=False, default=None, fraction=True),
    Key("attention_backward_efficiency", float, required=False, default=None, fraction=True),
    Key("comm_interference", float, required=False, default=0.0, non_negative=True, maximum=9.0),
)
CLUSTER_KEYS = (
    Key("name", str),
    Key("gpu", object),  # catalog name, path, or inline table; checked in load_cluster_table
    Key("gpus_per_node", int, positive=True, maximum=L.MAX_GPUS_PER_NODE),
    Key("intra_node", dict),
    Key("inter_node", dict),
    Key("host", dict),
    Key("uncertain", list, required=False, default=[]),
    Key("calibration", dict, required=False, default={}),
)
INTRA_KEYS = (
    Key("topology", str, choices=tuple(t.value for t in IntraNodeTopology)),
    Key("bandwidth_GBps", float, positive=True),
    Key("efficiency", float, fraction=True),
    Key("latency_us", float, non_negative=True),
)
INTER_KEYS = (
    Key("nics_per_node", int, positive=True),
    Key("nic_bandwidth_Gbps", float, positive=True),
    Key("efficiency", float, fraction=True),
    Key("latency_us", float, non_negative=True),
    Key("fabric_halving_nodes", float, required=False, default=math.inf, positive=True, maximum=1e6),
)
HOST_KEYS = (
    Key("cpu", str),
    Key("cores", int, positive=True),
    Key("dram_GiB", float, positive=True),
    Key("dram_bandwidth_GBps", float, positive=True),
    Key("pcie_bandwidth_GBps", float, positive=True),
    Key("pcie_efficiency", float, fraction=True),
    Key("pcie_latency_us", float, non_negative=True),
    Key("pcie_pageable_efficiency", float, required=False, default=0.5, fraction=True),
    Key("fresh_pageable_d2h_GBps", float, required=False, default=1.4 * GB, positive=True),
    Key("gpus_per_pcie_switch", int, positive=True),
    Key("cpu_adam_params_per_s", float, positive=True),
    Key("nvme_bandwidth_GBps", float, required=False, default=0.0, non_negative=True),
    Key("nvme_write_bandwidth_GBps", float, required=False, default=0.0, non_negative=True),
    Key("nvme_TB", float, required=False, default=0.0, non_negative=True),
    Key("nvme_latency_us", float, required=False, default=100.0 * US, positive=True, maximum=1e6),
    Key("launch_us", float, required=False, default=0.0, non_negative=True, maximum=1e6),
    Key("collective_launch_us", float, required=False, default=0.0, non_negative=True, maximum=1e6),
    Key("zero3_hook_us", float, required=False, default=0.0, non_negative=True, maximum=1e6),
    Key("fsdp2_hook_us", float, required=False, default=0.0, non_negative=True, maximum=1e6),
    Key("zero3_rank_piece_us", float, required=False, default=0.0, non_negative=True, maximum=1e6),
    Key("synchronous", bool, required=False, default=False),
)


def load_gpu(path: Path) -> GpuSpec:
    """Read a GPU file such as hardware/gpus/a100-sxm4-80g.toml."""
    return gpu_from_table(read_toml(path), path)


def gpu_from_table(table: Mapping[str, Any], source: str | Path, prefix: str = "") -> GpuSpec:
    v = read_table(table, GPU_KEYS, source, prefix)
    _check_uncertain(v["uncertain"], {k.name for k in GPU_KEYS}, source, prefix)
    attention = v["attention_efficiency"] or v["matmul_efficiency"]
    return GpuSpec(name=v["name"], memory=v["memory"], memory_bandwidth=v["memory_bandwidth"],
                   bf16_flops=v["bf16"], fp16_flops=v["fp16"], fp32_flops=v["fp32"], fp8_flops=v["fp8"],
                   matmul_efficiency=v["matmul_efficiency"],
                   memory_bandwidth_efficiency=v["memory_bandwidth_efficiency"],
                   uncertain=tuple(v["uncertain"]), kernel_overhead=v["kernel_overhead"],
                   sm_count=v["sm_count"], attention_efficiency=attention,
                   attention_backward_efficiency=v["attention_backward_efficiency"] or attention,
                   comm_interference=v["comm_interference"])


def load_cluster(path: Path) -> ClusterSpec:
    """Read a cluster (node type + network) file such as hardware/dgx-a100-80g.toml."""
    return cluster_from_table(read_toml(path), path, path.parent)


def cluster_from_table(table: Mapping[str, Any], source: str | Path, base_dir: Path,
                       prefix: str = "") -> ClusterSpec:
    """Build a ClusterSpec from a parsed table; `gpu` may be a name, a path or a table."""
    v = read_table(table, CLUSTER_KEYS, source, prefix)
    gpu_ref = v["gpu"]
    if isinstance(gpu_ref, dict):
        gpu = gpu_from_table(gpu_ref, source, prefix + "gpu.")
    elif isinstance(gpu_ref, str):
        gpu_path = resolve(gpu_ref, "hardware", base_dir, source, prefix + "gpu")
        gpu = load_gpu(gpu_path)
    else:
        raise InputError(source, prefix + "gpu", "expected a GPU catalog name, a path or a table")
    intra = read_table(v["intra_node"], INTRA_KEYS, source, prefix + "intra_node.")
    inter = read_table(v["inter_node"], INTER_KEYS, source, prefix + "inter_node.")
    host = read_table(v["host"], HOST_KEYS, source, prefix + "host.")
    _check_uncertain(v["uncertain"], _all_cluster_keys(), source, prefix)
    node = NodeSpec(
        gpu=gpu, gpus_per_node=v["gpus_per_node"], intra_topology=IntraNodeTopology(intra["topology"]),
        intra_node=LinkSpec(bandwidth=intra["bandwidth"], efficiency=intra["efficiency"],
                            latency=intra["latency"]),
        nics_per_node=inter["nics_per_node"],
        host=HostSpec(cpu=host["cpu"], cores=host["cores"], dram=host["dram"],
                      dram_bandwidth=host["dram_bandwidth"],
                      pcie=LinkSpec(bandwidth=host["pcie_bandwidth"],
                                    efficiency=host["pcie_efficiency"],
                                    latency=host["pcie_latency"]),
                      pcie_pageable_efficiency=host["pcie_pageable_efficiency"],
                      fresh_pageable_d2h=host["fresh_pageable_d2h"],
                      gpus_per_pcie_switch=host["gpus_per_pcie_switch"],
                      cpu_adam_params_per_s=host["cpu_adam_params_per_s"],
                      nvme_bandwidth=host["nvme_bandwidth"], nvme_write_bandwidth=host["nvme_write_bandwidth"],
                      nvme_capacity=host["nvme_TB"] * 1e12, nvme_latency=host["nvme_latency"], launch=host["launch"],
                      collective_launch=host["collective_launch"], zero3_hook=host["zero3_hook"],
                      fsdp2_hook=host["fsdp2_hook"], zero3_rank_piece=host["zero3_rank_piece"],
                      synchronous=host["synchronous"]))
    calibration, curves = read_calibration(v["calibration"], source, prefix + "calibration.")
    return ClusterSpec(name=v["name"], node=node,
                       inter_node=LinkSpec(bandwidth=inter["nic_bandwidth"],
                                           efficiency=inter["efficiency"], latency=inter["latency"]),
                       uncertain=tuple(v["uncertain"]), calibration=calibration, calibration_curves=curves,
                       fabric_halving_nodes=inter["fabric_halving_nodes"])


def _all_cluster_keys() -> set[str]:
    names = {k.name for k in CLUSTER_KEYS}
    for section, keys in (("intra_node", INTRA_KEYS), ("inter_node", INTER_KEYS), ("host", HOST_KEYS)):
        names |= {f"{section}.{k.name}" for k in keys}
    return names


def _check_uncertain(listed: list[Any], known: set[str], source: str | Path, prefix: str) -> None:
    """`uncertain` lists keys whose values are estimates; each must be a real key."""
    for item in listed:
        if not isinstance(item, str) or item not in known:
            raise InputError(source, prefix + "uncertain",
                             f"{item!r} is not a key of this file; allowed: {', '.join(sorted(known))}")
