"""ZeRO++ (Wang et al., arXiv 2306.10209) in DeepSpeed ZeRO-3 as implemented: three switches
of the ZeRO-3 engine model (sim.engines.deepspeed_zero3), each alone or together.

- qwZ (`zero_quantized_weights`, partition_parameters.py `all_gather_coalesced(quantize=True)`):
  each rank quantizes its flat partition to int8 in groups of about 8,000 elements
  (`CUDAQuantizer.target_group_size`, one fp32 scale per group; the paper's block size is
  smaller), the gather carries 1 B per element plus the scales, and waiting on it
  dequantizes the gathered batch back to 16 bits on the compute stream.
- hpZ (`zero_hpz_partition_size`): when a module's parameters are released, they keep a
  secondary partition over the `hpz` ranks of the node (`ds_secondary_tensor`, 16 bits,
  1/hpz of each tensor, dropped after the step), and every later gather of that module in
  the step runs inside the node from it: the backward's, the recomputation's and, with
  gradient accumulation, the forwards of micro-steps after the first. Only a module's first
  gather of the step crosses nodes. The secondary bytes are held as a resident buffer here
  (an upper estimate: they build up through the first forward). Simulated where hpz is the
  number of data-parallel ranks per node, DeepSpeed's recommended setting.
- qgZ (`zero_quantized_gradients`, coalesced_collectives.py `all_to_all_quant_reduce`): each
  gradient tensor of a bucket goes int4 through an all-to-all among the node's ranks, is
  dequantized, reduced, requantized, and goes through an all-to-all among the ranks at the
  same place on the other nodes, then dequantized and averaged; a 1-D tensor, or one whose
  size is not a multiple of 2 x dp, takes the plain reduce-scatter instead. The scale
  all-to-alls that accompany each are counted in the same collectives.

Kernel byte counts: quantize reads 16-bit values and writes the quantized ones; dequantize
the reverse (sim.analytic.kernels memory kernels at the GPU's HBM rate).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.analytic import kernels as kn
from sim.analytic.comm import tensor_padded
from sim.analytic.zeropp import QGZ_GROUP, QWZ_GROUP, SCALE_BYTES
from sim.core.enums import Axis, Coll
from sim.engines.schedule import OpRef, Phase, Stream
from sim.inputs.zero_config import ZeroConfig


@dataclass(frozen=True, slots=True)
class ZeroPlusPlus:
    """Which of qwZ / hpZ / qgZ are on, and the 16-bit value size `h`."""

    quantized_weights: bool
    hierarchical: bool
    quantized_gradients: bool
    h: int

    @classmethod
    def of(cls, z: ZeroConfig, h: int) -> ZeroPlusPlus:
        return cls(z.zero_quantized_weights, z.zero_hpz_partition_size > 1, z.zero_quantized_gradients, h)

    @property
    def any(self) -> bool:
        return self.quantized_weights or self.hierarchical or self.quantized_gradients

    def gather_axis(self, released: bool) -> Axis:
        """hpZ: a module released once this step has its secondary partition, and gathers
        from it inside the node (partition_parameters.py `all_gather_coalesced`:
        `use_secondary_tensor = params[0].ds_secondary_tensor is not None`)."""
        return Axis.DP_NODE if self.hierarchical and released else Axis.DP

    def gather_bytes(self, padded: float) -> float:
        """Bytes of an all-gather of `padded` elements: 16-bit, or int8 plus the scales."""
        if not self.quantized_weights:
            return self.h * padded
        return padded * (1.0 + SCALE_BYTES / QWZ_GROUP)

    def dequantize_weights(self, elements: float) -> tuple[kn.Kernel, ...]:
        """The gathered int8 values back to 16 bits, when the gather is waited for."""
        if not self.quantized_weights:
            return ()
        return (kn.memory("qwZ dequantize", (1.0 + self.h) * elements),)

    def quantizes_gradient(self, numel: int, shape_dims: int, dp: int) -> bool:
        """all_to_all_quant_reduce takes a tensor to int4 unless it is 1-D or not a multiple of 2 dp."""
        return self.quantized_gradients and shape_dims > 1 and numel % (2 * dp) == 0

    def gradient_kernels(self, numel: int, local: int) -> tuple[tuple[kn.Kernel, ...], tuple[kn.Kernel, ...],
                                                               tuple[kn.Kernel, ...]]:
        """(before the node hop, between the hops, after the last) for one tensor of `numel`
        elements with `local` data-parallel ranks per node: quantize to int4; dequantize the
        node's chunks, reduce, requantize 1/local of it; dequantize and average the result."""
        h, part = self.h, numel / max(1, local)
        return ((kn.memory("qgZ quantize (int4)", (h + 0.5) * numel),),
                (kn.memory("qgZ dequantize + reduce + requantize", 0.5 * numel + (h + 0.5) * part),),
                (kn.memory("qgZ dequantize + average", (0.5 + h) * part),))

    @staticmethod
    def int4_bytes(numel: float) -> float:
        """int4 values and their fp32 scales."""
        return numel * (0.5 + SCALE_BYTES / QGZ_GROUP)

    def secondary_bytes(self, partitioned: float, hpz: int) -> float:
        """hpZ's secondary partition of every partitioned parameter: 16 bits, 1/hpz."""
        return self.h * partitioned / hpz if self.hierarchical else 0.0


def qgz_reduce(p: Any, shapes: list[tuple[int, int]], ms: int, producer: OpRef | None, layer: int | None) -> OpRef:
    """One ZeRO-3 gradient bucket through qgZ (`all_to_all_quant_reduce`), tensor by tensor on
    the reduction stream, for the ZeRO-3 planner `p`: int4 all-to-all inside the node, then
    across nodes, with the quantization kernels between; a 1-D tensor (a norm's weight, a
    bias) or one whose size is not a multiple of 2 x dp takes a plain reduce-scatter.
    `shapes`: (numel, dimensions) of each gradient tensor of the bucket."""
    rep = p.layout.representatives[p.stage_index]
    local = len(p.layout.group(Axis.DP_NODE, rep))
    zpp: ZeroPlusPlus = p.zpp
    last = producer
    for n, dims in shapes:
        if not zpp.quantizes_gradient(n, dims, p.dp):
            last = p.collective(Stream.REDUCE, Coll.REDUCE_SCATTER, p.h * tensor_padded(n, p.dp),
                                "reduce_scatter (qgZ: not quantized)", Phase.BWD, ms, deps=[last], layer=layer,
                                purpose="grad bucket", pieces=p.dp)
            continue
        before, between, after = zpp.gradient_kernels(n, local)
        q = p.kernels_on(Stream.REDUCE, "qgZ quantize", Phase.BWD, ms, before, layer, [last])
        hop = p.collective(Stream.REDUCE, Coll.ALL_TO_ALL, zpp.int4_bytes(n), "qgZ all-to-all in the node",
                           Phase.BWD, ms, axis=Axis.DP_NODE, deps=[q], layer=layer, purpose="grad bucket")
        mid = p.kernels_on(Stream.REDUCE, "qgZ reduce", Phase.BWD, ms, between, layer, [hop])
        hop = p.collective(Stream.REDUCE, Coll.ALL_TO_ALL, zpp.int4_bytes(n / local), "qgZ all-to-all across nodes",
                           Phase.BWD, ms, axis=Axis.DP_ACROSS, deps=[mid], layer=layer, purpose="grad bucket")
        last = p.kernels_on(Stream.REDUCE, "qgZ dequantize", Phase.BWD, ms, after, layer, [hop])
    assert last is not None
    return last
