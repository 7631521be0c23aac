"""Benchmark: the GEMM kernel model against XLA's measured H100 bf16 matmuls.

Reads hardware/gpus/gemm-h100-xla.csv (375 shapes, b x m x n x k, from ROCm/xla
matmul_interpolator_data.h; source in the file's header), predicts each shape's TFLOPS
with sim.analytic.kernel_time on the catalog's H100 file (sim.studies.gemm_table, one fixed
per-call time fitted to the table), and prints the error (predicted / measured - 1)
overall, for large shapes (m, n, k >= 1024) and by GEMM size. `zerosim fit` keeps the
fitted H100 file within 10% median on this table (sim.studies.fit).

Run: python bench/gemm_shapes.py [--gpu hardware/gpus/h100-sxm5-80g.toml]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from sim.inputs.hardware import load_gpu
from sim.studies.gemm_table import compared, fitted_fixed_us, large_shapes, measured

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default=str(ROOT / "hardware" / "gpus" / "h100-sxm5-80g.toml"))
    gpu = load_gpu(Path(ap.parse_args().gpu))
    table = measured("H100")
    assert table is not None
    us = fitted_fixed_us(gpu, table)
    print(f"per-call fixed time that fits the table best: {us:.2f} us (catalog kernel_overhead_us: "
          f"{gpu.kernel_overhead * 1e6:.2f})")
    d = compared(gpu, table, us)
    for name, part in (("all shapes", d), ("m, n, k >= 1024", large_shapes(d))):
        e = part["error"]
        print(f"{name:18s} {len(part):4d} shapes: median |error| {100 * e.abs().median():5.1f}%, "
              f"median {100 * e.median():+5.1f}%, worst {100 * e.abs().max():5.1f}%")
    bins = pd.cut(d["gflop"], [0, 1, 10, 100, 1e6], labels=["< 1 GFLOP", "1-10", "10-100", "> 100"])
    print(d.groupby(bins, observed=True)["error"].agg(["count", "median"]).to_string(float_format="{:+.3f}".format))


if __name__ == "__main__":
    main()
