"""Benchmark: how fast the simulator answers, against raw SimPy measured in the same run.

Cases (the issue on engine speed): Llama-2-70B under DeepSpeed ZeRO-3 on 8 / 64 / 512 DGX
A100 nodes (64 / 512 / 4,096 GPUs) in representative mode, 512 GPUs in full mode, and GPT-3
175B with tp 8, pp 16, dp 8 on 1,024 GPUs (global batch 1,536: 192 micro-steps per step).
For each: planned ops, ops executed, SimPy events, wall time (planning included, a fresh
process's first call and the best of repeats), events/s, the simulated step time. The
ceiling is raw SimPy: processes that do nothing but wait on timeouts.

Run: python bench/engine_speed.py [--full] [--repeats N] [--only NAME]
Not a test: it prints what it measured (docs/benchmarks.md keeps the table).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import simpy

from sim.des.engine import Mode, events_scheduled
from sim.inputs.load import scenario_from_table
from sim.inputs.scenario import Scenario
from sim.simulate import simulate

HERE = Path("bench/engine_speed.py")


def llama70b_zero3(nodes: int) -> Scenario:
    table: dict[str, Any] = {
        "model": "llama2-70b", "cluster": "dgx-a100-80g", "nodes": nodes,
        "training": {"seq_len": 4096, "micro_batch": 1, "grad_accum": 1, "precision": "bf16", "recompute": "full"},
        "zero": {"stage": 3}}
    return scenario_from_table(table, HERE, f"llama2-70b_zero3_{nodes * 8}gpus")


def gpt3_3d() -> Scenario:
    table: dict[str, Any] = {
        "model": "gpt3-175b", "cluster": "dgx-a100-80g", "nodes": 128, "parallel": {"tp": 8, "pp": 16},
        "training": {"seq_len": 2048, "micro_batch": 1, "global_batch": 1536, "precision": "bf16",
                     "recompute": "full"},
        "zero": {"stage": 1}}
    return scenario_from_table(table, HERE, "gpt3-175b_tp8-pp16-dp8_1024gpus")


def mtnlg_530b() -> Scenario:
    """MT-NLG 530B (Smith et al. 2022, arXiv 2201.11990, Sec. 2.3 and Table 1): 105 layers,
    hidden 20480, 128 heads, sequence 2048, tp 8 x pp 35 on 280 DGX A100 nodes, global
    batch 1,920 at micro-batch 1 (240 micro-steps per stage)."""
    model = {"name": "MT-NLG-530B", "family": "gpt2", "layers": 105, "hidden": 20480, "heads": 128,
             "kv_heads": 128, "ffn_hidden": 81920, "vocab": 51200, "gated_mlp": False, "tied_embeddings": True,
             "norm": "layernorm", "bias": "all", "position": "learned", "max_positions": 2048}
    table: dict[str, Any] = {
        "model": model, "cluster": "dgx-a100-80g", "nodes": 280, "parallel": {"tp": 8, "pp": 35},
        "training": {"seq_len": 2048, "micro_batch": 1, "global_batch": 1920, "precision": "bf16",
                     "recompute": "full"},
        "zero": {"stage": 1}}
    return scenario_from_table(table, HERE, "mt-nlg-530b_tp8-pp35-dp8_2240gpus")


CASES = {
    "70B ZeRO-3, 64 GPUs": (lambda: llama70b_zero3(8), Mode.REPRESENTATIVE),
    "70B ZeRO-3, 512 GPUs": (lambda: llama70b_zero3(64), Mode.REPRESENTATIVE),
    "70B ZeRO-3, 4,096 GPUs": (lambda: llama70b_zero3(512), Mode.REPRESENTATIVE),
    "GPT-3 175B tp8 pp16, 1,024 GPUs": (gpt3_3d, Mode.REPRESENTATIVE),
    "MT-NLG 530B tp8 pp35, 2,240 GPUs": (mtnlg_530b, Mode.REPRESENTATIVE),
    "70B ZeRO-3, 512 GPUs, full": (lambda: llama70b_zero3(64), Mode.FULL),
}


def raw_simpy_rate(events: int = 400_000) -> float:
    """Events per second of SimPy alone: 100 processes yielding timeouts."""
    env = simpy.Environment()

    def ticker(n: int):  # type: ignore[no-untyped-def]
        for _ in range(n):
            yield env.timeout(1.0)
    for _ in range(100):
        env.process(ticker(events // 100))
    start = time.perf_counter()
    env.run()
    return events_scheduled(env) / (time.perf_counter() - start)


def measure(name: str, make, mode: Mode, repeats: int) -> None:  # type: ignore[no-untyped-def]
    s = make()
    walls = []
    for _ in range(repeats):
        start = time.perf_counter()
        r = simulate(s, mode=mode)
        walls.append(time.perf_counter() - start)
    events, executed = events_scheduled(r.engine.env), len(r.engine.spans)
    planned = sum(len(list(c.ops())) for c in r.schedule.classes)
    print(f"| {name} | {mode.value} | {planned:,} | {executed:,} | {events:,} | {walls[0]:.3f} | {min(walls):.3f} "
          f"| {events / min(walls):,.0f} | {r.step_time_s:.4f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--full", action="store_true", help="also run full mode (512 ranks, ~15 s)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    args = parser.parse_args()
    print(f"raw SimPy: {raw_simpy_rate():,.0f} events/s")
    print("| case | mode | planned ops | ops executed | SimPy events | wall, first call (s) | wall, best (s) "
          "| events/s | simulated step (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, (make, mode) in CASES.items():
        if args.only not in name or (mode is Mode.FULL and not args.full):
            continue
        measure(name, make, mode, 1 if mode is Mode.FULL else args.repeats)


if __name__ == "__main__":
    main()
