"""Plain-text rendering of a MemoryReport (GB = 1e9 bytes, as the ZeRO paper counts)."""

from __future__ import annotations

from sim.results.memory_report import MemoryReport

GB = 1e9
COLUMNS = (("params", "params_bytes"), ("grads", "grads_bytes"), ("optim", "optimizer_bytes"),
           ("activ", "activations_bytes"), ("buffers", "buffers_bytes"),
           ("frag", "fragmentation_bytes"), ("total", "total_bytes"), ("host", "host_bytes"))


def format_memory(r: MemoryReport) -> str:
    """The table a user reads: one row per ZeRO stage, GB per GPU."""
    columns = COLUMNS if r.this_stage is not None else COLUMNS[:3] + COLUMNS[6:7]
    lines = [r.title,
             f"parameters {r.n_params / 1e9:.3f}B total, {r.params_per_rank / 1e9:.3f}B on the "
             f"largest rank; convention: {r.convention}"
             + (f"; device memory {r.device_memory_bytes / GB:.1f} GB "
                f"({r.device_memory_bytes / 2**30:.1f} GiB)" if r.device_memory_bytes else ""),
             ""]
    header = f"{'':16s}" + "".join(f"{name:>9s}" for name, _ in columns)
    if r.device_memory_bytes:
        header += f"{'fits':>6s}{'max model':>12s}"
    lines += [header + "   (GB per GPU)"]
    for row in r.rows:
        mark = " <" if row.stage == r.this_stage else ""
        cells = "".join(f"{getattr(row, attr) / GB:9.2f}" for _, attr in columns)
        text = f"{row.label + mark:16s}{cells}"
        if r.device_memory_bytes:
            text += f"{'yes' if row.fits else 'NO':>6s}{_params(row.largest_model_params):>12s}"
        lines.append(text)
    lines.append("")
    if r.this_stage is not None:
        lines.append(f"< this scenario's stage: {'fits' if r.fits else 'DOES NOT FIT'}")
        own = r.rows[r.this_stage]
        if own.host_bytes > 0 and r.host_memory_bytes:
            node = own.host_bytes * r.gpus_per_node
            verdict = "fits" if node <= r.host_memory_bytes else "DOES NOT FIT"
            lines.append(f"host memory: {own.host_bytes / GB:.1f} GB per GPU x {r.gpus_per_node} GPUs = "
                         f"{node / GB:.1f} GB per node of {r.host_memory_bytes / GB:.1f} GB DRAM: {verdict}")
        if r.nvme_bytes_per_gpu > 0:
            node = r.nvme_bytes_per_gpu * r.gpus_per_node
            lines.append(f"NVMe: {r.nvme_bytes_per_gpu / GB:.1f} GB per GPU x {r.gpus_per_node} GPUs = {node / GB:.1f} GB "
                         f"per node of {r.nvme_capacity_bytes / GB:.1f} GB: {'fits' if r.fits_nvme else 'DOES NOT FIT'}")
    lines += [f"note: {n}" for n in r.notes]
    if r.device_memory_bytes:
        limits = r.to_json()["largest_model_params_limit"]
        assert isinstance(limits, dict)
        lines.append("largest model as dp grows without bound (model states only): "
                     + ", ".join(f"{k} {_params(v) if v else 'unbounded'}" for k, v in limits.items()))
    return "\n".join(lines)


def _params(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 1e12:
        return f"{value / 1e12:.2f}T"
    return f"{value / 1e9:.1f}B"
