"""Unit constants. Inside `sim`, sizes are bytes, times are seconds, work is FLOPs.

Human units (GB/s, us, TFLOPS) exist only in data files, as key suffixes such as
`_GBps`, `_us`, `_TFLOPS`; `sim.inputs.schema` converts them to SI once, at load time.
"""

from __future__ import annotations

KB, MB, GB, TB = 1e3, 1e6, 1e9, 1e12
KiB, MiB, GiB, TiB = 2.0**10, 2.0**20, 2.0**30, 2.0**40
US, MS = 1e-6, 1e-3
GFLOPS, TFLOPS = 1e9, 1e12
GBIT = 1e9 / 8  # bytes in one gigabit

# Key suffix in a data file -> factor that turns the number into SI.
SUFFIX_TO_SI: dict[str, float] = {
    "_GBps": GB,      # bytes/s
    "_TBps": TB,      # bytes/s
    "_Gbps": GBIT,    # bits/s -> bytes/s
    "_us": US,        # s
    "_ms": MS,        # s
    "_TFLOPS": TFLOPS,
    "_GFLOPS": GFLOPS,
    "_GiB": GiB,      # bytes
    "_GB": GB,        # bytes
    "_MiB": MiB,      # bytes
    "_MB": MB,        # bytes
}

BYTES_PER_ELEMENT: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1, "int4": 0}
