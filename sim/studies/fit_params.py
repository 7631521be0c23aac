"""The free parameters `zerosim fit` may move: physical properties of a GPU chip, of a
cluster's network, or of the host software, each one key of a hardware file.

Rules (issue 9, design.md "calibrated constants"): one value per hardware property, never
per row; every parameter has bounds that keep it physical (the sources in the comments); a
parameter is fitted only when some row of the fit depends on it. A GPU parameter is shared
by the files of the same chip at the same power limit (A100 40 GB and 80 GB have the same
SMs and kernels; a 500 W H100 sustains other clocks than a 700 W one: `chip`); a
cluster's fabric (how its rings slow with the node count) is its cluster file's, its
CPU-Adam rate its host CPU's; host software costs (kernel launch, ZeRO-3 and FSDP2 hook
pairs, ZeRO-3 per-rank slicing) are one value for every cluster file, because they are the
framework's CPU path, not the node's wiring. The inter-node efficiency itself is measured
on two nodes (nccl-tests) and not fitted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from sim.core.enums import AttentionImpl, Engine, OffloadDevice
from sim.core.specs import ClusterSpec, GpuSpec
from sim.core.units import GB, US
from sim.inputs.scenario import Scenario
from sim.inputs.zero_config import BLOCKING_OFFLOAD_VERSION

# Parts built on another part's die: H200 is the GH100 die of the H100 with HBM3e (NVIDIA
# H200 datasheet: the H100 SXM's compute); its memory bandwidth is its own peak.
SAME_DIE = {"H200": "H100"}
# Parts held at another power limit than their die's namesake: a power cap sets the SM clock
# a GEMM or a memory-bound kernel sustains (arXiv 2604.11391 measures DGEMM throughput and SM
# frequency of this very H100 HBM2e part from 200 W to 700 W), so their kernel efficiencies
# are their own. Meta's Grand Teton H100 runs at 500 W (torchtitan's benchmark page), the
# H100 SXM5 and H200 at 700 W; its peak is an estimate besides ("between SXM and NVL").
OWN_POWER_LIMIT = {"H100-SXM-96GB-HBM2e": "H100-500W"}


def chip(gpu: GpuSpec) -> str:
    """The silicon a GPU file describes, at its power limit: 'A100-SXM4-80GB' and
    'A100-SXM4-40GB' -> 'A100'; 'H200-SXM-141GB' -> 'H100' (the same die, both 700 W);
    'H100-SXM-96GB-HBM2e' -> 'H100-500W' (OWN_POWER_LIMIT)."""
    if gpu.name in OWN_POWER_LIMIT:
        return OWN_POWER_LIMIT[gpu.name]
    name = gpu.name.split("-")[0]
    return SAME_DIE.get(name, name)


@dataclass(frozen=True)
class Param:
    """One fitted key. `scope` is a chip ('A100'), a cluster name ('DGX-A100-80GB') or
    'host' (all clusters); `key` is the file key it writes (dotted inside a table)."""

    scope: str
    key: str
    low: float
    high: float
    source: str           # why the bounds are physical

    @property
    def name(self) -> str:
        return self.key if self.scope == "host" else f"{self.scope}.{self.key}"

    def applies(self, s: Scenario) -> bool:
        c = s.cluster
        if self.scope == "host":
            zero3 = s.engine is Engine.DEEPSPEED and s.zero is not None and s.zero.stage == 3
            uses = {"host.zero3_hook_us": zero3, "host.zero3_rank_piece_us": zero3 and s.parallel.dp > 1,
                    "host.fsdp2_hook_us": s.engine is Engine.FSDP2}
            return uses.get(self.key, True)
        if self.key == "inter_node.fabric_halving_nodes":
            return c.name == self.scope and s.nodes > 2
        if self.key == "host.cpu_adam_params_per_s":
            return c.node.host.cpu == self.scope and steps_on_the_cpu(s)
        if self.key == "host.fresh_pageable_d2h_GBps":
            return c.node.host.cpu == self.scope and copies_into_fresh_pages(s)
        if self.key == "attention_efficiency" and s.compute.attention is not AttentionImpl.FLASH:
            return False
        return chip(c.node.gpu) == self.scope

    def value(self, c: ClusterSpec) -> float:
        return GETTERS[self.key](c)

    def with_value(self, c: ClusterSpec, v: float) -> ClusterSpec:
        return SETTERS[self.key](c, v)


HOST_CPU_KEYS = ("host.cpu_adam_params_per_s", "host.fresh_pageable_d2h_GBps")


def cluster_scope(key: str, c: ClusterSpec) -> str:
    """What a per-node parameter belongs to: the network's fabric to the cluster file,
    the CPU-Adam rate and the fresh-pageable copy rate to the host CPU (DGX A100 40 GB and
    80 GB share their EPYC hosts)."""
    return c.node.host.cpu if key in HOST_CPU_KEYS else c.name


def copies_into_fresh_pages(s: Scenario) -> bool:
    """Whether the scenario copies to the host into tensors it allocates (Copy.fresh):
    DeepSpeed's `cpu_checkpointing`, or ZeRO-3 offload of v0.6.0-v0.19.4 (its cross-dtype
    gradient `copy_`, made only where some sub-group steps on the CPU)."""
    z = s.zero
    blocking = (z is not None and z.stage == 3 and z.deepspeed_version == BLOCKING_OFFLOAD_VERSION
                and z.offload_optimizer.device is not OffloadDevice.NVME and steps_on_the_cpu(s))
    return bool(s.training.cpu_checkpointing or blocking)


def steps_on_the_cpu(s: Scenario) -> bool:
    """Whether the scenario's optimizer runs on the host's cores (DeepSpeed's CPU-Adam under
    `offload_optimizer`, or torch's Adam under FSDP2's CPU offload)."""
    return bool((s.zero is not None and s.zero.offload_optimizer.enabled and s.zero.offload_optimizer.ratio > 0)
                or (s.fsdp is not None and s.fsdp.cpu_offload))


def _attention(c: ClusterSpec, v: float) -> ClusterSpec:
    """Forward and backward attention move together: the backward keeps its ratio to the
    forward (FlashAttention-2 README: the backward runs at a fixed fraction of the forward)."""
    g = c.node.gpu
    ratio = g.attention_backward_efficiency / g.attention_efficiency if g.attention_efficiency else 1.0
    return c.with_gpu(attention_efficiency=v, attention_backward_efficiency=min(1.0, v * ratio))


GETTERS: dict[str, Callable[[ClusterSpec], float]] = {
    "matmul_efficiency": lambda c: c.node.gpu.matmul_efficiency,
    "attention_efficiency": lambda c: c.node.gpu.attention_efficiency,
    "memory_bandwidth_efficiency": lambda c: c.node.gpu.memory_bandwidth_efficiency,
    "kernel_overhead_us": lambda c: c.node.gpu.kernel_overhead / US,
    "comm_interference": lambda c: c.node.gpu.comm_interference,
    "inter_node.fabric_halving_nodes": lambda c: c.fabric_halving_nodes,
    "host.cpu_adam_params_per_s": lambda c: c.node.host.cpu_adam_params_per_s,
    "host.fresh_pageable_d2h_GBps": lambda c: c.node.host.fresh_pageable_d2h / GB,
    "host.launch_us": lambda c: c.node.host.launch / US,
    "host.zero3_hook_us": lambda c: c.node.host.zero3_hook / US,
    "host.fsdp2_hook_us": lambda c: c.node.host.fsdp2_hook / US,
    "host.zero3_rank_piece_us": lambda c: c.node.host.zero3_rank_piece / US,
}
SETTERS: dict[str, Callable[[ClusterSpec, float], ClusterSpec]] = {
    "matmul_efficiency": lambda c, v: c.with_gpu(matmul_efficiency=v),
    "attention_efficiency": _attention,
    "memory_bandwidth_efficiency": lambda c, v: c.with_gpu(memory_bandwidth_efficiency=v),
    "kernel_overhead_us": lambda c, v: c.with_gpu(kernel_overhead=v * US),
    "comm_interference": lambda c, v: c.with_gpu(comm_interference=v),
    "inter_node.fabric_halving_nodes": lambda c, v: replace(c, fabric_halving_nodes=v),
    "host.cpu_adam_params_per_s": lambda c, v: c.with_host(cpu_adam_params_per_s=v),
    "host.fresh_pageable_d2h_GBps": lambda c, v: c.with_host(fresh_pageable_d2h=v * GB),
    "host.launch_us": lambda c, v: c.with_host(launch=v * US),
    "host.zero3_hook_us": lambda c, v: c.with_host(zero3_hook=v * US),
    "host.fsdp2_hook_us": lambda c, v: c.with_host(fsdp2_hook=v * US),
    "host.zero3_rank_piece_us": lambda c, v: c.with_host(zero3_rank_piece=v * US),
}

# Bounds: what a physical device or framework can do, with the source of each range.
GPU_BOUNDS = {
    "matmul_efficiency": (0.55, 0.95, "best-shape GEMM 0.6-0.93 of peak across V100-H100 (MAMF tables, "
                                      "stas00/ml-engineering; XLA matmul tables)"),
    "attention_efficiency": (0.2, 0.75, "FlashAttention-2/3 fwd 0.3-0.75 of peak (FA2 README, FA3 paper)"),
    "memory_bandwidth_efficiency": (0.6, 0.95, "HBM streaming 0.8-0.92 of spec (reference 4.3); lower for "
                                               "unfused PyTorch elementwise chains"),
    "kernel_overhead_us": (0.5, 15.0, "device gap between dependent kernels 1-10 us (Nsight traces, HTA docs)"),
    "comm_interference": (0.0, 0.4, "compute slowdown beside NCCL: 18.9% mean, 40% max (arXiv 2507.03114)"),
}
CLUSTER_BOUNDS = {
    "inter_node.fabric_halving_nodes": (2.0, 2000.0, "nodes beyond two at which a ring's inter-node busbw halves: "
                                                     "2.3-2.8 on 8 x 100 Gb/s RoCE (100 -> 40 GB/s from 2 to 6 "
                                                     "nodes, NVIDIA/nccl-tests#169), about 34 on 8 x 400 Gb/s RoCE "
                                                     "(all_gather 0.5 of line rate on 32 nodes, NVIDIA/nccl#1218); "
                                                     "2000: no decline within the 128 nodes of the data"),
    "host.cpu_adam_params_per_s": (1.0e9, 1.0e10, "DeepSpeedCPUAdam per node: 1.8 G params/s in the field "
                                                  "(DeepSpeed#6834); memory-bound near 0.65 x STREAM / 30 B per "
                                                  "parameter, 9-12 G/s on 400-600 GB/s hosts (reference 5)"),
    "host.fresh_pageable_d2h_GBps": (1.0, 13.0, "D2H into a freshly allocated pageable tensor: 1.4 GB/s on an "
                                                "A100 host (pytorch/pytorch#138018); at most one GPU's staged "
                                                "pageable copy (0.5 x 26 GB/s): page-fault cost depends on the "
                                                "host's OS (transparent huge pages)"),
}
HOST_BOUNDS = {
    "host.launch_us": (2.0, 30.0, "PyTorch dispatch + cudaLaunchKernel 5-20 us (HTA docs)"),
    "host.zero3_hook_us": (20.0, 2000.0, "DeepSpeed ZeRO-3 hook pair: 0.1-2 ms (DeepSpeed#1069, #3622)"),
    "host.fsdp2_hook_us": (20.0, 2000.0, "FSDP2 hook pair: ~1 ms pre-forward (pytorch#173680)"),
    "host.zero3_rank_piece_us": (1.0, 10.0, "Python narrow + append + cat input per slice: 2.3 us measured "
                                            "(sim.validate.measure.rank_piece_seconds), + record_stream on CUDA"),
}


def parameters(scenarios: Iterable[Scenario], only: Sequence[str] = ()) -> list[Param]:
    """Every parameter some scenario depends on (`only`: keep those whose key or name is
    listed), in a fixed order: GPU chips, then clusters, then host."""
    scenarios = list(scenarios)
    found: list[Param] = []
    for key, (lo, hi, src) in GPU_BOUNDS.items():
        for scope in sorted({chip(s.cluster.node.gpu) for s in scenarios if s.cluster.node.gpu.sm_count}):
            found.append(Param(scope, key, lo, hi, src))
    for key, (lo, hi, src) in CLUSTER_BOUNDS.items():
        for scope in sorted({cluster_scope(key, s.cluster) for s in scenarios}):
            found.append(Param(scope, key, lo, hi, src))
    for key, (lo, hi, src) in HOST_BOUNDS.items():
        found.append(Param("host", key, lo, hi, src))
    used = [p for p in found if any(p.applies(s) for s in scenarios)]
    if only:
        used = [p for p in used if p.key in only or p.name in only]
    return used


NEAR_BOUND = 0.05   # within this fraction of a parameter's range from one of its bounds


def leaning_on_bounds(s: Scenario) -> list[str]:
    """The fitted parameters a GPU scenario depends on (`Param.applies`) whose value lies
    within NEAR_BOUND of its range (`_place_in_range`) from a bound of the fit, or outside
    it: where the published-row fit pushed a physical property as far as it may go, the
    model may lack something there or the rows say little about it (docs/fidelity.md,
    "What it still misses"), and a prediction that depends on it inherits that. A CPU
    process (no SMs) has no fitted parameters."""
    if not s.cluster.node.gpu.sm_count:
        return []
    out = []
    for p in parameters([s]):
        value = p.value(s.cluster)
        where = _place_in_range(p, value)
        if where < 0 or where > 1:
            bound = f"outside the fit's bounds {p.low:g}-{p.high:g}"
        elif where <= NEAR_BOUND:
            bound = f"floor {p.low:g}"
        elif where >= 1 - NEAR_BOUND:
            bound = f"ceiling {p.high:g}"
        else:
            continue
        out.append(f"{p.name} {value:.4g} ({bound})")
    return out


def bound_notes(s: Scenario) -> list[str]:
    """One note naming the parameters of `leaning_on_bounds`, none when there are none
    (`zerosim run` and `zerosim explain` print it with their results)."""
    leaning = leaning_on_bounds(s)
    if not leaning:
        return []
    return ["fit: this step depends on parameters at (or past) a bound of the physical range `zerosim fit` "
            "allows them; where the published-row fit left a catalog value there, the model may lack "
            "something or the published rows say little about it, and this prediction inherits that "
            "(docs/fidelity.md, \"What it still misses\"): " + "; ".join(leaning)]


# The ideal machine (`ideal_start`): host software that costs the least its bounds allow, and
# networks and host CPUs as fast as theirs allow.
IDEAL_AT_FLOOR = ("host.launch_us", "host.zero3_hook_us", "host.fsdp2_hook_us", "host.zero3_rank_piece_us")
IDEAL_AT_CEILING = ("inter_node.fabric_halving_nodes", "host.cpu_adam_params_per_s", "host.fresh_pageable_d2h_GBps")


def ideal_start(params: Sequence[Param], x: Sequence[float]) -> list[float]:
    """`x` with the host-software costs at their floors and the fabric and host-CPU rates at
    their ceilings (the machine the simulator assumed before it modelled host and network
    overheads); GPU kernel parameters keep their values. A second start that no
    measurement chose: `zerosim fit --ideal-start`."""
    return [p.low if p.key in IDEAL_AT_FLOOR else p.high if p.key in IDEAL_AT_CEILING else v
            for p, v in zip(params, x, strict=True)]


def _place_in_range(p: Param, v: float) -> float:
    """Where v lies between p's bounds, 0 at the floor and 1 at the ceiling; on a log scale
    for a range of a decade or more (a fabric's halving distance of 57 nodes is not 'near'
    a floor of 2 in a range up to 2,000)."""
    return to_unit(p, v, spans_decades(p))


def spans_decades(p: Param) -> bool:
    """Whether p's bounds span a decade or more (a hook cost of 20-2,000 us, a CPU-Adam rate
    of 1-10 G/s): a range better measured in ratios than in differences."""
    return p.low > 0 and p.high / p.low >= 10


def to_unit(p: Param, v: float, log: bool) -> float:
    """v mapped onto [0, 1] between p's bounds (outside them beyond 0 or 1), linearly or,
    with `log`, by log(v / low) / log(high / low)."""
    if log:
        return math.log(max(v, 1e-300) / p.low) / math.log(p.high / p.low)
    return (v - p.low) / (p.high - p.low)


def from_unit(p: Param, u: float, log: bool) -> float:
    """The inverse of `to_unit`."""
    if log:
        return p.low * (p.high / p.low) ** u
    return p.low + u * (p.high - p.low)


def applied(s: Scenario, params: Sequence[Param], values: Sequence[float]) -> Scenario:
    """`s` on its cluster with the parameters that apply to it set to `values`."""
    c = s.cluster
    for p, v in zip(params, values, strict=True):
        if p.applies(s):
            c = p.with_value(c, v)
    return replace(s, cluster=c)


def start_values(params: Sequence[Param], scenarios: Sequence[Scenario]) -> list[float]:
    """The catalog's value of each parameter (the first scenario it applies to), clipped
    into its bounds."""
    out = []
    for p in params:
        s = next(s for s in scenarios if p.applies(s))
        out.append(min(p.high, max(p.low, p.value(s.cluster))))
    return out


# -- writing fitted values into hardware files -------------------------------------------------
def rewrite_toml(text: str, key: str, value: float, comment: str) -> str:
    """Replace `key = ...` (dotted: inside its [table]) keeping the layout; the old comment
    is replaced by `comment`. A key the file lacks is added to its table."""
    table, _, name = key.rpartition(".")
    lines = text.splitlines()
    current, insert_at = "", None
    for i, line in enumerate(lines):
        head = re.match(r"\s*\[([^\]]+)\]", line)
        if head:
            if current == table and insert_at is None:
                insert_at = i
            current = head.group(1).strip()
            continue
        old = re.match(rf"\s*{re.escape(name)}\s*=\s*([^#]*?)\s*(?:#\s*(.*))?$", line)
        if current == table and old:
            prior = old.group(2) or ""
            if "prior " in prior and prior.startswith("zerosim fit"):
                prior = prior[prior.index("prior "):]              # refitted: keep the first prior only
            else:
                prior = f"prior {old.group(1)}" + (f": {prior}" if prior else "")
            lines[i] = f"{name} = {value:.4g}  # {comment}; {prior}"
            return "\n".join(lines) + "\n"
    new = f"{name} = {value:.4g}  # {comment}"
    if current == table and insert_at is None:
        lines.append(new)
    elif insert_at is not None:
        lines.insert(insert_at, new)
    else:
        raise KeyError(f"no [{table}] table for {key}")
    return "\n".join(lines) + "\n"


def files_of(p: Param, catalog: Path) -> list[Path]:
    """The catalog hardware files that hold parameter `p` (host keys: every GPU cluster's)."""
    from sim.inputs.hardware import load_cluster, load_gpu
    if p.key in GPU_BOUNDS:
        return [f for f in sorted((catalog / "gpus").glob("*.toml")) if chip(load_gpu(f)) == p.scope]
    out = []
    for f in sorted(catalog.glob("*.toml")):
        cluster = load_cluster(f)
        if (p.scope == "host" and cluster.node.gpu.sm_count) or (p.key in CLUSTER_BOUNDS
                                                                 and cluster_scope(p.key, cluster) == p.scope):
            out.append(f)
    return out


PRIOR = re.compile(r"prior\s+([-+0-9.eE]+)")


def prior_values(params: Sequence[Param], catalog: Path) -> list[float | None]:
    """Each parameter's prior: the `prior V` a fitted key's comment keeps (the value before
    any fit, with its source), read from the first of its files that has one; None where no
    file records one (the key was never fitted: its catalog value is its prior)."""
    out: list[float | None] = []
    for p in params:
        table, _, name = p.key.rpartition(".")
        found = None
        for f in files_of(p, catalog):
            current = ""
            for line in f.read_text().splitlines():
                if head := re.match(r"\s*\[([^\]]+)\]", line):
                    current = head.group(1).strip()
                elif current == table and re.match(rf"\s*{re.escape(name)}\s*=", line) and (m := PRIOR.search(line)):
                    found = float(m.group(1))
                    break
            if found is not None:
                break
        out.append(found)
    return out


def write_files(params: Sequence[Param], values: Sequence[float], catalog: Path, out: Path,
                comment: Callable[[Param], str]) -> list[Path]:
    """Copy the catalog hardware files into `out` with the fitted values (only files some
    parameter touches); returns the files written."""
    from sim.inputs.hardware import load_gpu
    texts: dict[Path, str] = {}
    for p, v in zip(params, values, strict=True):
        if p.key in GPU_BOUNDS:
            continue
        for path in files_of(p, catalog):
            texts[path] = rewrite_toml(texts.get(path, path.read_text()), p.key, v, comment(p))
    for path in sorted((catalog / "gpus").glob("*.toml")):
        gpu = load_gpu(path)
        for p, v in zip(params, values, strict=True):
            if p.key in GPU_BOUNDS and chip(gpu) == p.scope:
                text = texts.get(path, path.read_text())
                if p.key == "attention_efficiency" and gpu.attention_efficiency:
                    ratio = gpu.attention_backward_efficiency / gpu.attention_efficiency
                    text = rewrite_toml(text, "attention_backward_efficiency", min(1.0, v * ratio),
                                        comment(p) + " (backward/forward ratio kept)")
                texts[path] = rewrite_toml(text, p.key, v, comment(p))
    written = []
    for path, text in texts.items():
        target = out / path.relative_to(catalog)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        written.append(target)
    return written
