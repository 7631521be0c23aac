"""Peak GPU memory that published runs state, against the simulator's (bench/published_memory.py,
docs/fidelity.md "Peak memory").

A row states memory in its metric ("peak GPU memory (allocated)", value and unit), in its
other reported metrics ("peak memory 82.4 GiB", "peak GPU mem 56GB", "allocated 4.32 GB,
max allocated 8.09 GB"), or as an out-of-memory outcome. What the number counts matters:

- allocated: torch.cuda.max_memory_allocated, the tensors alone: what the simulator's
  memory pool tracks (model states, activations, buffers), so the two compare directly;
- reserved: the caching allocator's segments (torch.cuda.max_memory_reserved; "cached" in
  older torch), allocated plus the allocator's fragmentation and cached free blocks, so the
  simulator's peak should come out below it; torchtitan logs this one
  (torchtitan/metrics.py `max_reserved_gib`);
- unstated: the source does not say (nvidia-smi would also count the CUDA context).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

GB, GIB = 1e9, 2.0**30
_AMOUNT = re.compile(r"~?\s*([\d.]+)\s*(GiB|GB)\b", re.I)
ALLOCATED, RESERVED, UNSTATED, OOM = "allocated", "reserved", "unstated", "OOM"


@dataclass(frozen=True, slots=True)
class MemoryFigure:
    """A published peak: bytes per GPU (None for an out-of-memory outcome), what it counts,
    and the text it was read from."""

    nbytes: float | None
    kind: str
    text: str


def _kind(text: str, framework: str) -> str:
    low = text.lower()
    if "reserved" in low or "cached" in low:
        return RESERVED
    if "allocated" in low:
        return ALLOCATED
    return RESERVED if "torchtitan" in framework.lower() else UNSTATED


def _amount(text: str) -> float | None:
    m = _AMOUNT.search(text)
    if not m:
        return None
    return float(m.group(1)) * (GIB if m.group(2).lower() == "gib" else GB)


def memory_figure(f: Mapping[str, str]) -> MemoryFigure | None:
    """The peak memory per GPU a row of the 39-column table states, or None."""
    metric, framework = f.get("metric", ""), " ".join(f.get(c, "") for c in ("framework", "source"))
    if "oom" in metric.lower() or f.get("value", "").strip().upper() == "OOM":
        return MemoryFigure(None, OOM, metric.strip())
    if "mem" in metric.lower():
        text = f"{metric} {f.get('value', '')} {f.get('unit', '')}"
        amount = _amount(text)
        return MemoryFigure(amount, _kind(metric, framework), " ".join(text.split())) if amount else None
    pieces = [p.strip() for p in re.split(r"[;,]", f.get("other_reported_metrics", "")) if p.strip()]
    memory = [p for p in pieces if re.search(r"\bmem|allocated|reserved", p, re.I) and _amount(p)]
    if not memory:
        return None
    peak = next((p for p in memory if re.search(r"peak|max", p, re.I)), memory[-1])
    amount = _amount(peak)
    assert amount is not None
    return MemoryFigure(amount, _kind(peak, framework), peak)
