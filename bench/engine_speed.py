"""Benchmark: simulator wall time and events per second for Llama-2-70B under ZeRO-3 on
64 DGX A100 nodes (512 GPUs), in representative and in full mode.

Run: python bench/engine_speed.py [--full] [--micro-steps N]
Not a test: it prints what it measured. Full mode simulates all 512 ranks and takes
minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from sim.des.engine import Mode, events_scheduled
from sim.inputs.load import scenario_from_table
from sim.simulate import simulate


def scenario(micro_steps: int):  # type: ignore[no-untyped-def]
    table = {"model": "llama2-70b", "cluster": "dgx-a100-80g", "nodes": 64,
             "training": {"seq_len": 4096, "micro_batch": 1, "grad_accum": micro_steps, "precision": "bf16",
                          "recompute": "full"},
             "zero": {"stage": 3}}
    return scenario_from_table(table, Path("bench/engine_speed.py"), "llama2-70b_zero3_dgx-a100-80gx64")


def measure(mode: Mode, micro_steps: int) -> None:
    s = scenario(micro_steps)
    start = time.perf_counter()
    r = simulate(s, mode=mode)
    wall = time.perf_counter() - start
    events, ops = events_scheduled(r.engine.env), len(r.engine.spans)
    print(f"{mode.value:15s} ranks {len(r.engine.ranks):4d}  ops {ops:9,d}  events {events:10,d}  "
          f"wall {wall:7.2f} s  {events / wall:10,.0f} events/s  simulated step {r.step_time_s:.3f} s  "
          f"MFU {100 * r.to_json()['mfu']:.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--full", action="store_true", help="also run full mode (all 512 ranks)")
    parser.add_argument("--micro-steps", type=int, default=1)
    args = parser.parse_args()
    measure(Mode.REPRESENTATIVE, args.micro_steps)
    if args.full:
        measure(Mode.FULL, args.micro_steps)


if __name__ == "__main__":
    main()
