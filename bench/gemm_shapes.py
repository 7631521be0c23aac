"""Benchmark: the GEMM kernel model against XLA's measured H100 bf16 matmuls.

Reads bench/data/gemm_h100_xla.csv (375 shapes, b x m x n x k, from ROCm/xla
matmul_interpolator_data.h; source in the file's header), predicts each shape's TFLOPS
with sim.analytic.kernel_time on the catalog's H100 file, and prints the error
(predicted / measured - 1) overall, for large shapes (m, n, k >= 1024) and by GEMM size.

Run: python bench/gemm_shapes.py [--gpu hardware/gpus/h100-sxm5-80g.toml] [--floor]
(--floor: also the lowest `matmul_efficiency`, in steps of 0.01, at which the table's median
|error| stays under 10%: the floor `zerosim fit` keeps for the chip, sim.studies.fit_params
CHIP_BOUNDS.)
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from sim.analytic.kernel_time import kernel_time
from sim.analytic.kernels import gemm
from sim.inputs.hardware import load_gpu

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "bench" / "data" / "gemm_h100_xla.csv"


def compared(gpu_file: Path, fixed_us: float | None = None) -> pd.DataFrame:
    """Measured and predicted TFLOPS per shape; `fixed_us` replaces the GPU's per-kernel
    overhead (XLA's timings include a fixed per-call cost)."""
    gpu = load_gpu(gpu_file)
    if fixed_us is not None:
        gpu = replace(gpu, kernel_overhead=fixed_us * 1e-6)
    d = pd.read_csv(TABLE, comment="#")
    kernels = [gemm("g", r.m, r.n, r.k, r.b) for r in d.itertuples()]
    d["predicted"] = [k.flops / kernel_time(k, gpu, "bf16") / 1e12 for k in kernels]
    d["gflop"] = [k.flops / 1e9 for k in kernels]
    d["error"] = d["predicted"] / d["tflops"] - 1
    return d


def fitted_fixed_us(gpu_file: Path) -> float:
    """The per-call fixed time (0-20 us) that best explains the table: least squares on
    log(predicted / measured) over every shape, the shape model otherwise unchanged."""
    from scipy.optimize import minimize_scalar
    cost = lambda us: float((np.log1p(compared(gpu_file, us)["error"]) ** 2).sum())  # noqa: E731
    return float(minimize_scalar(cost, bounds=(0.0, 20.0), method="bounded", options={"xatol": 0.05}).x)


def median_error_at(gpu_file: Path, efficiency: float) -> float:
    """The table's median |error| with the GPU's `matmul_efficiency` set to `efficiency`
    and the per-call fixed time refitted."""
    import tempfile

    from sim.studies.fit_params import rewrite_toml
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / gpu_file.name
        f.write_text(rewrite_toml(gpu_file.read_text(), "matmul_efficiency", efficiency, "trial"))
        return float(compared(f, fitted_fixed_us(f))["error"].abs().median())


def efficiency_floor(gpu_file: Path, bound: float = 0.10, step: float = 0.01) -> float:
    """The lowest `matmul_efficiency` on a `step` grid whose median |error| is under `bound`
    (the error falls as the efficiency rises towards the table's best over 0.55-0.95)."""
    grid = np.round(np.arange(0.55, 0.95 + step / 2, step), 4)
    return float(next(e for e in grid if median_error_at(gpu_file, float(e)) < bound))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default=str(ROOT / "hardware" / "gpus" / "h100-sxm5-80g.toml"))
    ap.add_argument("--floor", action="store_true", help="also print the efficiency floor (10%% median)")
    args = ap.parse_args()
    gpu_file = Path(args.gpu)
    us = fitted_fixed_us(gpu_file)
    print(f"per-call fixed time that fits the table best: {us:.2f} us (catalog kernel_overhead_us: "
          f"{load_gpu(gpu_file).kernel_overhead * 1e6:.2f})")
    d = compared(gpu_file, us)
    large = d[(d.m >= 1024) & (d.n >= 1024) & (d.k >= 1024)]
    for name, part in (("all shapes", d), ("m, n, k >= 1024", large)):
        e = part["error"]
        print(f"{name:18s} {len(part):4d} shapes: median |error| {100 * e.abs().median():5.1f}%, "
              f"median {100 * e.median():+5.1f}%, worst {100 * e.abs().max():5.1f}%")
    bins = pd.cut(d["gflop"], [0, 1, 10, 100, 1e6], labels=["< 1 GFLOP", "1-10", "10-100", "> 100"])
    print(d.groupby(bins, observed=True)["error"].agg(["count", "median"]).to_string(float_format="{:+.3f}".format))
    if args.floor:
        print(f"lowest matmul_efficiency with median |error| under 10%: {efficiency_floor(gpu_file):.2f}")


if __name__ == "__main__":
    main()
