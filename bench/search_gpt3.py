"""Benchmark: `zerosim search` for GPT-3 175B on 128 DGX A100 nodes at a global batch of
1,536 (scenarios/gpt3-175b_ptd-p_dgx-a100-80gx128.toml), the issue's acceptance case.

Prints the wall time (target: under 2 minutes on 2 cores), the ten best layouts, whether
they keep tensor parallelism inside a node (as every published layout does), and where
Megatron's published PTD-P layout (TP 8, PP 16, DP 8, micro-batch 1) ranks against the
best ZeRO-3 layout (SC21 Table 2 measured PTD-P faster), searched on today's DeepSpeed and
on the 2021 DeepSpeed the paper ran (`zerosim search --deepspeed-version 0.5`). Run:
python bench/search_gpt3.py [--top N]. Not a test: about two minutes.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from sim.inputs.load import load_scenario
from sim.inputs.zero_config import CURRENT_VERSION, LEGACY_VERSION
from sim.simulate import simulate
from sim.studies.search import search

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "gpt3-175b_ptd-p_dgx-a100-80gx128.toml"
RELEASES = {CURRENT_VERSION: "today's engine", LEGACY_VERSION: "v0.3.13-v0.5.4, the 2021 engine SC21 measured"}
COLUMNS = ["rank", "strategy", "tp", "pp", "virtual_stages", "dp", "micro_batch", "recompute", "step_time_s", "mfu",
           "bound_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    start = time.perf_counter()
    ranked, rejected = search(SCENARIO, top=args.top)
    wall = time.perf_counter() - start
    print(f"wall time {wall:.1f} s; {len(ranked)} ranked, {len(rejected)} rejected")
    print(ranked.head(args.top)[COLUMNS].to_string(index=False))
    best = ranked.head(args.top)
    print(f"best {args.top} keep TP inside a node (tp <= 8): {bool((best['tp'] <= 8).all())}")
    ptdp_s = simulate(load_scenario(SCENARIO)).step_time_s        # the file is the published layout
    place = int((ranked["step_time_s"] < ptdp_s).sum()) + 1
    print(f"PTD-P as published (megatron tp 8 pp 16 dp 8, micro 1, full recompute): {ptdp_s:.2f} s, "
          f"would rank {place} of the {len(ranked)} ranked")
    zero3 = ranked[ranked["strategy"].str.startswith("deepspeed z3")]
    z3_pruned = rejected[rejected["strategy"].str.startswith("deepspeed z3")
                         & rejected["reason"].str.startswith("pruned")]
    for version in (CURRENT_VERSION, LEGACY_VERSION):
        z3, _ = search(SCENARIO, top=1, max_simulations=64, strategies=("deepspeed z3",), deepspeed_version=version)
        if z3.empty:
            print(f"DeepSpeed {version}: no ZeRO-3 layout fits")
            continue
        best = z3.iloc[0]
        print(f"best ZeRO-3 layout on DeepSpeed {version} ({RELEASES[version]}): tp {best['tp']} dp {best['dp']} "
              f"micro {best['micro_batch']} recompute {best['recompute']}: {best['step_time_s']:.2f} s; "
              f"PTD-P as published ranks above every ZeRO-3 layout: {ptdp_s < best['step_time_s']}")
    print(f"ZeRO-3 layouts in the full ranking: {len(zero3)} (best rank "
          f"{int(zero3['rank'].min()) if len(zero3) else '-'}); pruned by their bound: {len(z3_pruned)}")


if __name__ == "__main__":
    main()
