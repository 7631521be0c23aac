"""pandas views of a simulation: a tidy event table and a per-collective summary with the
columns of DeepSpeed's `comms_logger` / `log_summary` (message size, count, total and
average latency, algbw, busbw; deepspeed/utils/comms_logging.py `calc_bw_log`)."""

from __future__ import annotations

import pandas as pd

from sim.analytic.opcost import bus_factor
from sim.core.enums import Coll
from sim.engines.schedule import Collective, Copy, Kind, Send
from sim.results.step import SimulationResult


def event_table(result: SimulationResult) -> pd.DataFrame:
    """One row per executed op: rank, node, stream, kind, name, op, layer, phase, times."""
    layout = result.layout
    rows = []
    for sp in result.engine.spans:
        op = sp.op
        comm = op if isinstance(op, Collective | Send) else None
        moved = op.nbytes if isinstance(op, Collective | Send | Copy) else 0.0
        rows.append({"rank": sp.rank, "node": layout.node(sp.rank), "step": sp.step, "stream": op.stream.value,
                     "kind": op.kind.value, "name": op.name, "op": comm.coll.value if comm else "",
                     "layer": op.layer, "phase": op.phase.value, "micro_step": op.micro_step,
                     "start_us": sp.start * 1e6, "end_us": sp.end * 1e6, "dur_us": (sp.end - sp.start) * 1e6,
                     "wait_us": (sp.start - sp.ready) * 1e6, "bytes": moved,
                     "group": comm.axis.value if comm else "",
                     "group_size": len(layout.group(comm.axis, sp.rank)) if comm else 1})
    return pd.DataFrame(rows)


def collective_summary(result: SimulationResult) -> pd.DataFrame:
    """Per (op, message size): count, total / average latency, algbw and busbw (GB/s)."""
    events = event_table(result)
    coll = events[(events["kind"] == Kind.COLLECTIVE.value) & (events["rank"] == events["rank"].min())].copy()
    if coll.empty:
        return pd.DataFrame(columns=["op", "message_bytes", "count", "total_latency_ms", "avg_latency_ms",
                                     "algbw_GBps", "busbw_GBps"])
    coll["latency_s"] = coll["dur_us"] / 1e6
    out = coll.groupby(["op", "bytes", "group_size"], as_index=False).agg(
        count=("latency_s", "size"), total_latency_s=("latency_s", "sum"))
    out["avg_latency_s"] = out["total_latency_s"] / out["count"]
    out["algbw_GBps"] = out["bytes"] / out["avg_latency_s"] / 1e9
    out["busbw_GBps"] = [a * bus_factor(Coll(o), n) for a, o, n in
                         zip(out["algbw_GBps"], out["op"], out["group_size"])]
    out["total_latency_ms"] = out["total_latency_s"] * 1e3
    out["avg_latency_ms"] = out["avg_latency_s"] * 1e3
    out = out.rename(columns={"bytes": "message_bytes"})
    return out[["op", "message_bytes", "group_size", "count", "total_latency_ms", "avg_latency_ms",
                "algbw_GBps", "busbw_GBps"]].sort_values(["op", "message_bytes"]).reset_index(drop=True)

