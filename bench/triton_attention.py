"""Benchmark (a what-if, nothing fitted): llm-foundry's rows with their attention slower by a
fixed ratio, as if timed as the Triton kernel they ran rather than as FlashAttention-2.

llm-foundry's 2023 benchmark tables (mosaicml/llm-foundry b2a43a1: submit_benchmarks.py's
default `--attn_impl triton`, which sweep.sh never overrides) ran its Triton flash attention
(llmfoundry/models/layers/flash_attn_triton.py, on `triton_pre_mlir`, whose sm90 branch only
raised the highest compute capability it accepts: it issues A100-style mma instructions on an
H100). The simulator times it as flash attention at the GPU's `attention_efficiency`. Tri
Dao's header of that kernel (Dao-AILab/flash-attention flash_attn/flash_attn_triton.py,
tested with triton 2.0.0.dev20221202 on A100) says its forward + backward is slightly slower
than FlashAttention-1, and FlashAttention-2's A100 benchmark (assets/
flash2_a100_fwd_bwd_benchmark.png, causal, head dim 128, sequence 2k) puts FlashAttention-1
at 69 TFLOP/s against FlashAttention-2's 155: a ratio of about 0.45.

For each usable llm-foundry row this prints the error (predicted / published - 1) on the
catalog as shipped, and with the row's attention efficiency (forward and backward) times
`--ratio`, every other value unchanged.

Run: python bench/triton_attention.py [--ratio 0.45]
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from sim.simulate import simulate
from sim.studies.fit_params import SETTERS
from sim.studies.published import read_rows

TABLE = Path(__file__).resolve().parent.parent.parent / "shared" / "validation" / "published-fsdp-offload.csv"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ratio", type=float, default=0.45, help="attention speed of the Triton kernel / flash's")
    ap.add_argument("--table", type=Path, default=TABLE, help="published-fsdp-offload.csv")
    args = ap.parse_args()
    print(f"{'row':6s}{'GPU':17s}{'seq':>6s}{'published s':>13s}{'as flash':>10s}{f'x {args.ratio:g}':>10s}")
    for row in read_rows(args.table):
        if not (row.usable and row.id.startswith("LF")) or row.scenario is None or row.measured_step_s is None:
            continue
        s = row.scenario
        gpu = s.cluster.node.gpu
        slower = SETTERS["attention_efficiency"](s.cluster, gpu.attention_efficiency * args.ratio)
        flash = simulate(s).step_time_s / row.measured_step_s - 1
        triton = simulate(dataclasses.replace(s, cluster=slower)).step_time_s / row.measured_step_s - 1
        print(f"{row.id:6s}{gpu.name:17s}{s.training.seq_len:6d}{row.measured_step_s:13.3f}{flash:+10.1%}{triton:+10.1%}")


if __name__ == "__main__":
    main()
