"""The short human report of `zerosim run`."""

from __future__ import annotations

from typing import Any

GB = 1e9


def format_run(j: dict[str, Any], question: str) -> str:
    t, mem = j["time"], j["memory"]
    lines = [f"{j['scenario']}  [{j['engine']}, schedule {j['schedule']}, {j['mode']} mode]"]
    if question:
        lines.append(f"question: {question}")
    lines += [
        f"step time      {j['step_time_s']:.4f} s     tokens/s (job) {j['tokens_per_s']:,.0f}",
        f"TFLOPS/GPU     {j['tflops_per_gpu']:.1f} model, {j['hw_tflops_per_gpu']:.1f} hardware     MFU {100 * j['mfu']:.1f}%",
        "time           " + ", ".join(f"{k[:-2].replace('_', ' ')} {v:.4f} s" for k, v in t.items()),
    ]
    share = {"host": t["exposed_host_s"], "communication": t["exposed_comm_s"], "offload": t["exposed_offload_s"],
             "pipeline bubble": t["bubble_s"]}.get(j["bound"], t["compute_s"]) / j["step_time_s"]
    lines.append(f"bound by       {j['bound']} ({100 * share:.0f}% of the step)")
    if j["exposed_comm_by_kind_s"]:
        top = sorted(j["exposed_comm_by_kind_s"].items(), key=lambda kv: -kv[1])[:4]
        lines.append("exposed comm   " + ", ".join(f"{k} {v:.4f} s" for k, v in top))
    lines.append(f"peak memory    {mem['peak_bytes'] / GB:.2f} GB of {mem['device_bytes'] / GB:.1f} GB (rank {mem['rank']}): "
                 + ", ".join(f"{k[:-6]} {mem[k] / GB:.2f}" for k in
                             ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "buffers_bytes")))
    if mem["host_bytes_per_node"] > 0:
        lines.append(f"host memory    {mem['host_bytes_per_gpu'] / GB:.1f} GB per GPU, {mem['host_bytes_per_node'] / GB:.1f} GB "
                     f"per node of {mem['host_capacity_bytes'] / GB:.1f} GB DRAM")
    if not mem["fits_device"]:
        oom = mem["out_of_memory"]
        lines.append(f"DOES NOT FIT: at {oom['time_s']:.4f} s allocating {oom['allocating']} "
                     f"({oom['bytes'] / GB:.2f} GB) with {oom['in_use_bytes'] / GB:.2f} GB in use")
    if mem["nvme_bytes_per_node"] > 0:
        lines.append(f"NVMe           {mem['nvme_bytes_per_node'] / GB:.1f} GB per node of "
                     f"{mem['nvme_capacity_bytes'] / GB:.1f} GB")
        if not mem["fits_nvme"]:
            lines.append(f"DOES NOT FIT on NVMe: {mem['nvme_bytes_per_node'] / GB:.1f} GB per node > "
                         f"{mem['nvme_capacity_bytes'] / GB:.1f} GB")
    if not mem["fits_host"]:
        lines.append(f"DOES NOT FIT in host memory: {mem['host_bytes_per_node'] / GB:.1f} GB per node > "
                     f"{mem['host_capacity_bytes'] / GB:.1f} GB DRAM")
    lines.append("collectives per step (per rank): " + "; ".join(
        f"{c['op']} on {c['group']}({c['group_size']}) x{c['count']} {c['bytes_per_rank'] / GB:.3f} GB" for c in j["comm"]))
    lines += [f"note: {n}" for n in j["notes"]]
    return "\n".join(lines)
