"""Measured GEMM tables in the hardware catalog, and how far the kernel model is from them.

A chip whose bf16 GEMMs were measured shape by shape has a table beside its GPU files
(`hardware/gpus/gemm-h100-xla.csv`: XLA's 375 H100 shapes, ROCm/xla
matmul_interpolator_data.h, source in the file's header). The kernel model
(sim.analytic.kernel_time) predicts each shape on a GPU file; the table's timings are of
isolated calls, launch included, so one fixed per-call time, fitted to the table, stands in
for the file's `kernel_overhead_us`. `zerosim fit` keeps a chip's fitted GPU parameters
where this comparison stays within `GEMM_BOUND`, over every shape and over the large ones
(sim.studies.fit), so that no step-time fit makes a chip's GEMMs slower, or faster, than
the chip runs them. (Bounding every shape alone is not enough: a fit on 2026-12-06 kept it
at 10.1% with a GEMM efficiency of 0.63 and an HBM efficiency of 0.78, its large shapes
23% slow.)
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import numpy as np
import pandas as pd

from sim.analytic.kernel_time import kernel_time
from sim.analytic.kernels import gemm
from sim.core.specs import GpuSpec
from sim.inputs.catalog import catalog_dir

TABLES = {"H100": "gemm-h100-xla.csv"}    # chip (sim.studies.fit_params.chip) -> file in hardware/gpus
GEMM_BOUND = 0.10                          # the median |error| a fitted GPU file must keep
LARGE = 1024                               # m, n and k at least this: a large GEMM


@cache
def measured(chip: str) -> pd.DataFrame | None:
    """The chip's measured GEMM table (columns b, m, n, k, tflops), or None without one."""
    name = TABLES.get(chip)
    return None if name is None else pd.read_csv(catalog_dir("hardware") / "gpus" / name, comment="#")


def compared(gpu: GpuSpec, table: pd.DataFrame, fixed_us: float | None = None) -> pd.DataFrame:
    """The table with each shape's predicted TFLOPS, GFLOP and error (predicted / measured
    - 1); `fixed_us` replaces the GPU's per-kernel overhead."""
    if fixed_us is not None:
        gpu = replace(gpu, kernel_overhead=fixed_us * 1e-6)
    shapes = table[["m", "n", "k", "b"]].to_numpy(dtype=int)
    kernels = [gemm("g", int(m), int(n), int(k), int(b)) for m, n, k, b in shapes]
    d = table.copy()
    d["predicted"] = [k.flops / kernel_time(k, gpu, "bf16") / 1e12 for k in kernels]
    d["gflop"] = [k.flops / 1e9 for k in kernels]
    d["error"] = d["predicted"] / d["tflops"] - 1
    return d


def fitted_fixed_us(gpu: GpuSpec, table: pd.DataFrame) -> float:
    """The per-call fixed time (0-20 us) that best explains the table: least squares on
    log(predicted / measured) over every shape, the shape model otherwise unchanged."""
    from scipy.optimize import minimize_scalar
    cost = lambda us: float((np.log1p(compared(gpu, table, us)["error"]) ** 2).sum())  # noqa: E731
    return float(minimize_scalar(cost, bounds=(0.0, 20.0), method="bounded", options={"xatol": 0.05}).x)


def large_shapes(d: pd.DataFrame) -> pd.DataFrame:
    """The rows of a table whose m, n and k are all at least `LARGE`."""
    return d[(d.m >= LARGE) & (d.n >= LARGE) & (d.k >= LARGE)]


def median_errors(gpu: GpuSpec, table: pd.DataFrame) -> tuple[float, float]:
    """The table's median |error| on `gpu` over every shape and over the large shapes
    (m, n, k >= `LARGE`, the GEMMs of training steps, where `matmul_efficiency` alone sets
    the rate), with the per-call time fitted to the table."""
    d = compared(gpu, table, fitted_fixed_us(gpu, table))
    return float(d["error"].abs().median()), float(large_shapes(d)["error"].abs().median())


def excess(gpu: GpuSpec, table: pd.DataFrame, bound: float) -> float:
    """How far `gpu` lies beyond `bound` on the table: the sum of what each median |error|
    (every shape; large shapes) exceeds it by, 0 within both."""
    return sum(max(0.0, e - bound) for e in median_errors(gpu, table))
