"""DeepSpeed's `aio` section: how its libaio handle reads and writes ZeRO-Infinity's NVMe
swap files (deepspeed/runtime/swap_tensor/constants.py and aio_config.py, DeepSpeed 0.19:
`block_size` 1 MiB, `queue_depth` 8, `intra_op_parallelism` 1 (`thread_count` before 0.15),
`single_submit` false, `overlap_events` true, `use_gds` false).

What it changes (sim.analytic.opcost.aio_efficiency): the bytes in flight per rank,
queue_depth x block_size x intra_op_parallelism, halved without `overlap_events` (a thread
then waits for its whole batch before it submits the next). DeepSpeed reads the section only
when something is swapped to NVMe; elsewhere it changes nothing, here as there.
`single_submit` (one io_submit per block: microseconds against a block's transfer) and
`use_gds` (GPUDirect Storage, no host bounce buffer) are refused at other values as not
simulated yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sim.core.errors import InputError
from sim.core.specs import DEFAULT_AIO_BLOCK, DEFAULT_AIO_QUEUE_DEPTH, AioConfig
from sim.inputs.schema import Key, read_table

AIO_KEYS = (
    Key("block_size", int, required=False, default=DEFAULT_AIO_BLOCK, positive=True, maximum=2**31),
    Key("queue_depth", int, required=False, default=DEFAULT_AIO_QUEUE_DEPTH, positive=True, maximum=65536),
    Key("intra_op_parallelism", int, required=False, default=None, positive=True, maximum=1024),
    Key("thread_count", int, required=False, default=None, positive=True, maximum=1024),
    Key("single_submit", bool, required=False, default=False, not_simulated=True),
    Key("overlap_events", bool, required=False, default=True),
    Key("use_gds", bool, required=False, default=False, not_simulated=True),
)


def read_aio(raw: Any, source: str | Path, prefix: str = "aio.") -> AioConfig:
    """An `aio` table (a DeepSpeed config's or a scenario's) with DeepSpeed's defaults."""
    if not isinstance(raw, Mapping):
        raise InputError(source, prefix.rstrip("."), "expected a table of DeepSpeed aio keys")
    v = read_table(raw, AIO_KEYS, source, prefix)
    if v["intra_op_parallelism"] is not None and v["thread_count"] is not None:
        raise InputError(source, prefix + "thread_count", "given with intra_op_parallelism, its newer name; "
                         "allowed: one of them")
    threads = v["intra_op_parallelism"] or v["thread_count"] or 1
    return AioConfig(block_size=v["block_size"], queue_depth=v["queue_depth"], intra_op_parallelism=threads,
                     overlap_events=v["overlap_events"])
