"""Chrome / Perfetto trace of a simulation (Trace Event Format; reference 6.1).

One process per node, one thread per rank and stream, `X` events in microseconds (an op
that runs several kernels shows them as slices nested in it), memory
as a counter track per rank, collectives with PyTorch profiler argument names
(`Collective name`, `In msg nelems`, `Out msg nelems`, `Group size`, `dtype`).
"""

from __future__ import annotations

import json
from typing import Any

from sim.analytic.opcost import wire_bytes_per_rank
from sim.core.enums import Coll
from sim.des.engine import Span, kernel_time
from sim.des.host import hook_cost
from sim.engines.layout import Layout
from sim.engines.schedule import Collective, Compute, Copy, Send, Stream
from sim.results.step import SimulationResult

US = 1e6
STREAM_ORDER = {s: i for i, s in enumerate(Stream)}


def chrome_trace(result: SimulationResult) -> dict[str, Any]:
    """The trace as a JSON-serialisable dict (deterministic: sorted, no wall-clock data)."""
    layout, engine = result.layout, result.engine
    events: list[dict[str, Any]] = []
    threads: set[tuple[int, int, str]] = set()
    elem = 2 if result.scenario.training.precision.value != "fp32" else 4
    for span in engine.spans:
        node = layout.node(span.rank)
        tid = span.rank * 10 + STREAM_ORDER[span.op.stream]
        threads.add((node, tid, f"rank {span.rank} {span.op.stream.value}"))
        events.append({"name": span.op.name, "cat": span.op.kind.value, "ph": "X", "pid": node, "tid": tid,
                       "ts": span.start * US, "dur": (span.end - span.start) * US,
                       "args": _args(span, layout, elem)})
        if isinstance(span.op, Compute) and len(span.op.kernels) > 1:
            events += _kernels(span, node, tid, result)
    for rank, pool in sorted(engine.pools.items()):
        for t, used in pool.timeline:
            events.append({"name": f"memory rank {rank}", "ph": "C", "pid": layout.node(rank), "ts": t * US,
                           "args": {"GB": used / 1e9}})
    meta = [{"name": "process_name", "ph": "M", "pid": n, "args": {"name": f"node {n}"}}
            for n in sorted({n for n, _, _ in threads})]
    meta += [{"name": "thread_name", "ph": "M", "pid": n, "tid": tid, "args": {"name": name}}
             for n, tid, name in sorted(threads)]
    meta += [{"name": "thread_sort_index", "ph": "M", "pid": n, "tid": tid, "args": {"sort_index": tid}}
             for n, tid, _ in sorted(threads)]
    events.sort(key=lambda e: (e["ts"], e["pid"], e.get("tid", -1), -e.get("dur", 0.0), e["name"]))
    return {"traceEvents": meta + events, "displayTimeUnit": "ms",
            "otherData": {"scenario": result.scenario.name, "schedule": result.schedule.strategy,
                          "mode": result.mode.value, "steps": result.steps}}


def _kernels(span: Span, node: int, tid: int, result: SimulationResult) -> list[dict[str, Any]]:
    """A compute op's kernels as slices nested inside it, back to back, each no earlier than
    the host launched it (sim.des.host)."""
    out, t = [], span.start
    s = result.scenario
    assert isinstance(span.op, Compute)
    launched = span.host_begun + hook_cost(span.op, s.cluster.host, s.engine)
    for k in span.op.kernels:
        if span.host_begun >= 0:
            launched += s.cluster.host.launch
            t = max(t, launched)
        seconds = kernel_time(k, s)
        out.append({"name": k.name, "cat": "kernel", "ph": "X", "pid": node, "tid": tid, "ts": t * US,
                    "dur": seconds * US, "args": {"kind": k.kind.value, "flops": k.flops, "bytes": k.bytes,
                                                  "micro_step": span.op.micro_step, "step": span.step}})
        t += seconds
    return out


def _args(span: Span, layout: Layout, elem: int) -> dict[str, Any]:
    op = span.op
    args: dict[str, Any] = {"phase": op.phase.value, "micro_step": op.micro_step, "step": span.step}
    if op.layer is not None:
        args["layer"] = op.layer
    if span.blocker is not None:
        args["waited_for"] = span.blocker.name
        args["waited_us"] = (span.start - span.ready) * US
    if isinstance(op, Collective | Send):
        n = len(layout.group(op.axis, span.rank))
        nelems = op.nbytes / elem
        per_rank_in = nelems / n if op.coll is Coll.ALL_GATHER else nelems
        per_rank_out = nelems / n if op.coll is Coll.REDUCE_SCATTER else nelems
        args.update({"Collective name": op.coll.value, "In msg nelems": int(per_rank_in),
                     "Out msg nelems": int(per_rank_out), "Group size": n, "dtype": "bf16/fp16" if elem == 2 else "fp32",
                     "group": op.axis.value, "purpose": op.purpose,
                     "wire bytes per rank": wire_bytes_per_rank(op.coll, op.nbytes, n)})
    elif isinstance(op, Copy):
        args["bytes"] = op.nbytes
    return args


def write_chrome_trace(result: SimulationResult, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(chrome_trace(result), f, sort_keys=True, separators=(",", ":"))
