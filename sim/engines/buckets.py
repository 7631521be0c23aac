"""Gradient bucketing rules of the engines, as pure functions of tensor sizes.

DeepSpeed (stage_1_and_2.py / stage3.py, IPG bucket): before adding a gradient of numel n,
the bucket is flushed if elements + n > reduce_bucket_size; the gradient then starts the
next bucket (a gradient larger than the bucket is reduced alone).
torch DDP (reducer.cpp `compute_bucket_assignment_by_size`): gradients are appended in
reverse parameter order and a bucket closes once it reaches its cap in bytes; the first
bucket's cap is 1 MiB (`dist._DEFAULT_FIRST_BUCKET_BYTES`), the others `bucket_cap_mb`.
"""

from __future__ import annotations

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
