"""How long one device kernel takes (sim.analytic.kernels), on a GPU described by GpuSpec.

- GEMM: the slower of its FLOPs at an efficiency that depends on the shape, and its bytes
  at HBM speed. The shape efficiency is the GPU's best-shape efficiency (`matmul_efficiency`,
  e.g. MAMF's 86% on A100) times two losses that NVIDIA's "Matrix Multiplication Background
  User's Guide" describes: *tile and wave quantization* (the output is cut into thread-block
  tiles, the tiles run in waves of one per SM; a partial last wave or a partial tile is
  paid in full; cuBLAS picks the tile, so we take the best of the usual tile shapes, a
  smaller tile paying a lower per-SM efficiency) and a *short reduction* (each tile's
  main loop over k has a fixed prologue and epilogue, costing about `GEMM_K_OVERHEAD`
  values of k).
- Attention: fused (flash) kernels at their own efficiency (`attention_efficiency`,
  backward at `attention_backward_efficiency`), which also falls for short sequences
  (the same tile effect on the s x s score matrix: `ATTENTION_TILE`).
- fp8 GEMMs (Float8 linears) run at the GPU's fp8 peak at the same shape efficiency: a
  cuBLASLt fp8 GEMM of 8192^3 on H100 SXM reaches 1,600-1,630 TFLOPS, 0.81-0.82 of its
  1,979 (a 2026-05-24 cuBLASLt cross-check report, gitea.d-robotics.cc test_gpu_scripts),
  as bf16 reaches 0.80 (MAMF).
- Memory-bound kernels: bytes at HBM bandwidth x `memory_bandwidth_efficiency`.
- Every kernel adds `kernel_overhead` (the device-side gap between dependent kernels).
"""

from __future__ import annotations

import math

from sim.analytic.kernels import Kernel, KernelKind
from sim.core.specs import GpuSpec

# (rows, cols) of the output tile per thread block and the tile's efficiency relative to the
# largest: CUTLASS / cuBLAS Ampere-Hopper configurations (256x128 and 128x256 reach the best
# rate; 128x128 ~0.95, 128x64 ~0.85, 64x64 ~0.7: less reuse per loaded byte; estimates
# bounded by the matmul guide's tile-quantization figures).
GEMM_TILES: tuple[tuple[int, int, float], ...] = (
    (256, 128, 1.0), (128, 256, 1.0), (128, 128, 0.95), (128, 64, 0.85), (64, 128, 0.85), (64, 64, 0.7))
GEMM_K_OVERHEAD = 64      # values of k a tile's prologue and epilogue cost (2 k-blocks of 32): estimate
ATTENTION_TILE = 128      # FlashAttention-2 query / key block (Dao 2023, Sec. 3.3)


def wave_efficiency(m: int, n: int, batch: int, sms: int) -> float:
    """Useful output / output paid for, for the best tile: tiles are padded to full size
    and run in whole waves of `sms` (1.0 where `sms` is 0: no SM model, e.g. a CPU)."""
    if sms <= 0 or m <= 0 or n <= 0:
        return 1.0
    best = 0.0
    for rows, cols, tile_eff in GEMM_TILES:
        tiles = math.ceil(m / rows) * math.ceil(n / cols) * batch
        waves = math.ceil(tiles / sms)
        best = max(best, tile_eff * (m * n * batch) / (waves * sms * rows * cols))
    return best


def gemm_efficiency(m: int, n: int, k: int, batch: int, gpu: GpuSpec) -> float:
    """Fraction of the dense peak a GEMM of this shape reaches."""
    return gpu.matmul_efficiency * wave_efficiency(m, n, batch, gpu.sm_count) * k / (k + GEMM_K_OVERHEAD)


def attention_efficiency(seq: int, backward: bool, gpu: GpuSpec) -> float:
    """Fraction of peak a causal fused-attention kernel reaches at sequence length `seq`:
    the kernel's efficiency times the share of its query x key blocks that are full (the
    diagonal blocks of a causal mask are half empty)."""
    eff = gpu.attention_backward_efficiency if backward else gpu.attention_efficiency
    return eff * causal_share(seq)


def causal_share(seq: int) -> float:
    """The useful share of the query x key tiles a causal kernel computes (1 for seq 0)."""
    blocks = math.ceil(seq / ATTENTION_TILE)
    useful = blocks * (blocks + 1) / 2 * ATTENTION_TILE**2
    return (seq * seq / 2) / useful if seq > 0 else 1.0


def kernel_time(k: Kernel, gpu: GpuSpec, precision: str) -> float:
    """Seconds one kernel takes on `gpu` in `precision` (its GEMMs at that precision's peak)."""
    hbm = gpu.memory_bandwidth * gpu.memory_bandwidth_efficiency
    if k.kind is KernelKind.MEMORY:
        return k.bytes / hbm + gpu.kernel_overhead
    peak = gpu.fp8_flops if k.fp8 else gpu.peak_flops(precision)
    if k.kind is KernelKind.GEMM:
        rate = peak * gemm_efficiency(k.m, k.n, k.k, k.batch, gpu)
    else:
        rate = peak * attention_efficiency(k.seq, k.backward, gpu)
    return max(k.flops / rate, k.bytes / hbm) + gpu.kernel_overhead
