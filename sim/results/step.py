"""SimulationResult: one simulated run and the results contract (design.md).

Step time, tokens/s for the job, model and hardware TFLOPS per GPU, MFU, the time
breakdown, peak memory with its components (the rank with the highest peak), host memory,
and the collectives of one optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.analytic.opcost import wire_bytes_per_rank
from sim.des.engine import EventEngine, Mode
from sim.des.memory_pool import MemoryPool
from sim.engines.layout import Layout
from sim.engines.schedule import Collective, Mem, Schedule, Send
from sim.inputs.scenario import Scenario
from sim.results.attribution import TimeBreakdown


@dataclass
class SimulationResult:
    scenario: Scenario
    schedule: Schedule
    layout: Layout
    engine: EventEngine
    mode: Mode
    steps: int
    step_time_s: float
    breakdown: TimeBreakdown
    model_flops: float
    hardware_flops: float

    @property
    def fits_device(self) -> bool:
        return all(p.oom is None for p in self.engine.pools.values())

    @property
    def fits(self) -> bool:
        host = self.scenario.cluster.host
        return self.fits_device and self.host_node_bytes() <= host.dram and self.fits_nvme

    @property
    def fits_nvme(self) -> bool:
        return self.host_node_bytes(nvme=True) <= self.scenario.cluster.host.nvme_capacity

    def host_node_bytes(self, nvme: bool = False) -> float:
        """Host memory (or, with `nvme`, NVMe space: ZeRO-Infinity) the busiest node needs:
        the resident host-side allocations of every rank on it, summed (sim.engines.resident)."""
        per_class = [sum(a.nbytes for a in c.host if (a.category is Mem.NVME) == nvme) for c in self.schedule.classes]
        if not any(per_class):
            return 0.0
        gpn, layout = self.scenario.gpus_per_node, self.layout
        if len(per_class) == 1:
            return per_class[0] * min(gpn, layout.world_size)
        return max(sum(per_class[layout.class_of(r)] for r in range(node * gpn, min((node + 1) * gpn, layout.world_size)))
                   for node in range(layout.nodes))

    def peak_pool(self) -> MemoryPool:
        return max(self.engine.pools.values(), key=lambda p: (p.peak, -p.rank))

    def comm_table(self) -> list[dict[str, Any]]:
        """Collectives of one optimizer step on the representative rank, by kind and group."""
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        for op in self.schedule.ops(0):
            if not isinstance(op, Collective | Send):
                continue
            n = len(self.layout.group(op.axis, self.layout.representatives[0]))
            row = rows.setdefault((op.coll.value, op.axis.value), {
                "op": op.coll.value, "group": op.axis.value, "group_size": n, "count": 0,
                "bytes_per_rank": 0.0, "message_bytes": 0.0})
            row["count"] += 1
            row["bytes_per_rank"] += wire_bytes_per_rank(op.coll, op.nbytes, n)
            row["message_bytes"] += op.nbytes
        return [rows[k] for k in sorted(rows)]

    def to_json(self) -> dict[str, Any]:
        s, t = self.scenario, self.scenario.training
        gpus = s.world_size
        peak = self.peak_pool()
        b = self.breakdown
        per_gpu_tflops = self.model_flops / gpus / self.step_time_s / 1e12
        return {
            "scenario": s.name, "fits": self.fits, "step_time_s": self.step_time_s,
            "tokens_per_s": t.global_batch * t.seq_len / self.step_time_s,
            "tflops_per_gpu": per_gpu_tflops,
            "hw_tflops_per_gpu": self.hardware_flops / gpus / self.step_time_s / 1e12,
            "mfu": per_gpu_tflops * 1e12 / s.cluster.gpu.peak_flops(t.precision),
            "time": {"compute_s": b.compute_s, "exposed_comm_s": b.exposed_comm_s,
                     "exposed_offload_s": b.exposed_offload_s, "bubble_s": b.bubble_s,
                     "optimizer_s": b.optimizer_s, "exposed_host_s": b.exposed_host_s},
            "bound": bound(b, self.step_time_s),
            "exposed_comm_by_kind_s": dict(sorted(b.exposed_by_kind.items())),
            "exposed_comm_by_layer_s": dict(sorted(b.exposed_by_layer.items(), key=lambda kv: _layer_key(kv[0]))),
            "memory": {"peak_bytes": peak.peak, "rank": peak.rank, "device_bytes": peak.capacity,
                       "params_bytes": peak.peak_breakdown.get(Mem.PARAMS, 0.0),
                       "grads_bytes": peak.peak_breakdown.get(Mem.GRADS, 0.0),
                       "optimizer_bytes": peak.peak_breakdown.get(Mem.OPTIMIZER, 0.0),
                       "activations_bytes": peak.peak_breakdown.get(Mem.ACTIVATIONS, 0.0),
                       "buffers_bytes": peak.peak_breakdown.get(Mem.BUFFERS, 0.0),
                       "out_of_memory": peak.oom, "fits_device": self.fits_device,
                       "host_bytes_per_gpu": max(sum(a.nbytes for a in c.host if a.category is not Mem.NVME)
                                                 for c in self.schedule.classes),
                       "host_bytes_per_node": self.host_node_bytes(),
                       "host_capacity_bytes": s.cluster.host.dram,
                       "fits_host": self.host_node_bytes() <= s.cluster.host.dram,
                       "nvme_bytes_per_node": self.host_node_bytes(nvme=True),
                       "nvme_capacity_bytes": s.cluster.host.nvme_capacity, "fits_nvme": self.fits_nvme},
            "comm": self.comm_table(),
            "engine": s.engine.value, "schedule": self.schedule.strategy, "mode": self.mode.value,
            "steps": self.steps, "notes": self.schedule.notes,
        }


BOUND_SHARE = 0.10   # an exposed class this large a share of the step names what bounds it


def bound(b: TimeBreakdown, step_s: float) -> str:
    """What the step waits on besides its own compute: the largest exposed class (host,
    communication, offload, pipeline bubble) when it is at least BOUND_SHARE of the step,
    else 'compute'."""
    exposed = {"host": b.exposed_host_s, "communication": b.exposed_comm_s,
               "offload": b.exposed_offload_s, "pipeline bubble": b.bubble_s}
    name, seconds = max(exposed.items(), key=lambda kv: kv[1])
    return name if step_s > 0 and seconds >= BOUND_SHARE * step_s else "compute"


def _layer_key(name: str) -> tuple[int, int]:
    return (1, -1) if name == "-" else (0, int(name))
