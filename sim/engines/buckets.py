"""Gradient bucketing rules of the engines, as pure functions of tensor sizes.

DeepSpeed (stage_1_and_2.py / stage3.py, IPG bucket): before adding a gradient of numel n,
the bucket is flushed if elements + n > reduce_bucket_size; the gradient then starts the
next bucket (a gradient larger than the bucket is reduced alone).
torch DDP (reducer.cpp `compute_bucket_assignment_by_size`): gradients are appended in
reverse parameter order and a bucket closes once it reaches its cap in bytes; the first
bucket's cap is 1 MiB (`dist._DEFAULT_FIRST_BUCKET_BYTES`), the others `bucket_cap_mb`.
Megatron-Core (param_and_grad_buffer.py): the same reverse order, buckets of at least
max(40M, 1M x dp) elements when gradient reduction overlaps backward, else one bucket.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

FIRST_DDP_BUCKET_BYTES = 2**20


@dataclass
class DeepSpeedBucket:
    capacity: int                     # elements
    elements: int = 0

    def add(self, numel: int) -> list[int]:
        """Add one gradient; return the sizes (elements) of buckets flushed before it."""
        flushed = []
        if self.elements and self.elements + numel > self.capacity:
            flushed.append(self.elements)
            self.elements = 0
        self.elements += numel
        return flushed

    def flush(self) -> list[int]:
        """The epilogue: reduce what is left."""
        out = [self.elements] if self.elements else []
        self.elements = 0
        return out


@dataclass
class DdpBucket:
    cap_bytes: float
    element_bytes: int
    elements: int = 0
    closed: list[int] = field(default_factory=list)

    def add(self, numel: int) -> list[int]:
        """Add one gradient; return the sizes of buckets this gradient completes."""
        self.elements += numel
        cap = FIRST_DDP_BUCKET_BYTES if not self.closed else self.cap_bytes
        if self.elements * self.element_bytes >= cap:
            self.closed.append(self.elements)
            done, self.elements = self.elements, 0
            return [done]
        return []

    def flush(self) -> list[int]:
        out = [self.elements] if self.elements else []
        if out:
            self.closed.append(self.elements)
        self.elements = 0
        return out


MEGATRON_MIN_BUCKET = 40_000_000      # elements: max(40M, 1M x dp) (distributed_data_parallel.py)
MEGATRON_BUCKET_PER_RANK = 1_000_000
MEGATRON_PARAM_ALIGN = 64             # distributed optimizer: each param starts 64-element aligned
MEGATRON_BUCKET_ALIGN = 128           # ... and each bucket ends on a multiple of lcm(dp, 128)


@dataclass(frozen=True, slots=True)
class MegatronBucket:
    """One bucket of Megatron-Core's gradient buffer: tensors [start, stop) of the
    backward-ordered list, `elements` long including the distributed optimizer's padding."""

    start: int
    stop: int
    elements: int


def megatron_bucket_size(dp: int, given: int | None) -> int:
    """Megatron-Core's default bucket: max(40M, 1M x dp) elements, when overlapping."""
    return given if given is not None else max(MEGATRON_MIN_BUCKET, MEGATRON_BUCKET_PER_RANK * dp)


def megatron_buckets(numels: list[int], capacity: int | None, *, dp: int,
                     distributed_optimizer: bool) -> list[MegatronBucket]:
    """`_ParamAndGradBuffer.__init__` (megatron/core/distributed/param_and_grad_buffer.py,
    core r0.8): parameters in reverse order (`numels` is that order, roughly backprop's),
    a bucket closes once it holds at least `capacity` elements (None: one bucket). With the
    distributed optimizer each parameter starts on a 64-element boundary and each bucket is
    padded to a multiple of lcm(dp, 128), so that it splits evenly over the ranks."""
    unit = math.lcm(dp, MEGATRON_BUCKET_ALIGN) if distributed_optimizer else 1
    align = MEGATRON_PARAM_ALIGN if distributed_optimizer else 1
    out: list[MegatronBucket] = []
    start, filled = 0, 0
    for i, numel in enumerate(numels):
        filled = -(-filled // align) * align + numel
        if capacity is not None and filled >= capacity:
            out.append(MegatronBucket(start, i + 1, -(-filled // unit) * unit))
            start, filled = i + 1, 0
    if start < len(numels):
        out.append(MegatronBucket(start, len(numels), -(-filled // unit) * unit))
    return out
