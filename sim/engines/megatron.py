"""Megatron-Core's data parallelism and optimizer, as implemented (core r0.8.0:
megatron/core/distributed/distributed_data_parallel.py, param_and_grad_buffer.py,
megatron/core/optimizer/distrib_optimizer.py; Transformer Engine 1.9 userbuffers).

- Parameters in the training dtype; gradients accumulate into one contiguous buffer, fp32
  with bf16 (`accumulate_allreduce_grads_in_fp32`, forced by megatron/training/arguments.py).
- Buckets (sim.engines.buckets.megatron_buckets): reverse parameter order, at least
  max(40M, 1M x dp) elements with `overlap_grad_reduce`, else one bucket; pipeline stages
  after the first always use one bucket ("not on the critical path").
- Gradient sync only on the last micro-batch (`no_sync` before it). With
  `overlap_grad_reduce` a bucket's collective starts on the communication stream once its
  last gradient is ready; without it, every bucket is reduced after backward, blocking.
  The collective is an all-reduce, or with the distributed optimizer a reduce-scatter.
- Distributed optimizer: fp32 master weights and Adam m, v sharded over dp (6 + 12/d bytes
  per parameter with bf16; docs/source/distrib_optimizer.md), Adam on the shard, then an
  all-gather of the 16-bit parameters per bucket: blocking at the end of the step, or with
  `overlap_param_gather` dispatched one bucket ahead of the next forward (the global forward
  pre-hook waits for a module's bucket and dispatches the next). zerosim plans that gather
  at the start of the step it serves, which is the same steady state.
- `tp_comm_overlap` (needs sequence parallelism): Transformer Engine hides the TP
  all-gathers and reduce-scatters behind the GEMMs (ring-exchange all-gathers on copy
  engines; pipelined and bulk reduce-scatters on 16 SMs). zerosim runs a block's TP
  collectives on their own stream beside that block's compute; the next block waits for
  them, so a block exposes only what its compute cannot cover. This is coarser than TE's
  per-GEMM chunks (the attention core and elementwise kernels count as cover too) and the
  SMs it takes are the DES's compute-communication interference.

Not simulated (small beside the above): the tied-embedding gradient all-reduce between the
first and last pipeline stages, the sequence-parallel norm-gradient all-reduce over TP, the
distributed optimizer's separate bucket for a shared embedding; the 4-byte grad-norm and
fp16 found-inf all-reduces run over the data-parallel group here (Megatron reduces them over
the model-parallel group, or all ranks with the distributed optimizer), in the planner and
its twin alike.
"""

from __future__ import annotations

import math
from functools import cached_property

from sim.analytic.placement import TensorGroup, census_numel, chunk_tensors
from sim.analytic.volumes import megatron_engine_volume
from sim.core.enums import Axis, Coll, Engine, ScheduleMode
from sim.core.errors import InputError
from sim.core.units import BYTES_PER_ELEMENT
from sim.engines.buckets import MEGATRON_BUCKET_ALIGN, MegatronBucket, megatron_bucket_size, megatron_buckets
from sim.engines.layout import Layout
from sim.engines.model import EngineModel
from sim.engines.policies import GpuAdam
from sim.engines.resident import Resident, resident
from sim.engines.schedule import Alloc, Direction, Mem, OpRef, Phase, Stream
from sim.engines.skeleton import Planner
from sim.engines.uses import B, F, Use
from sim.inputs.scenario import Scenario
from sim.inputs.scenario_tables import MegatronConfig


def config(s: Scenario) -> MegatronConfig:
    assert s.megatron is not None
    return s.megatron


def grad_dtype(s: Scenario) -> str:
    """Gradient buffer and reduction dtype: fp32 with bf16 (Megatron forces it), else the
    training dtype, unless `grad_reduce_in_fp32` says otherwise."""
    fp32 = config(s).grad_reduce_in_fp32
    if fp32 is None:
        fp32 = s.training.precision.value in ("bf16", "fp32")
    return "fp32" if fp32 else s.training.precision.value


def grad_bytes(s: Scenario) -> int:
    return BYTES_PER_ELEMENT[grad_dtype(s)]


def bucket_capacity(s: Scenario, stage: int, chunk: int = 0) -> int | None:
    """Elements per bucket: one bucket without overlap, on every stage but the first, and in
    every model chunk but the first (megatron/training/training.py `get_model`:
    `disable_bucketing=(model_chunk_idx > 0)`; DDP drops bucketing on pipeline ranks > 0)."""
    c = config(s)
    if not c.overlap_grad_reduce or stage > 0 or chunk > 0:
        return None
    return megatron_bucket_size(s.parallel.dp, c.bucket_size)


def stage_buckets(s: Scenario, numels_by_chunk: list[list[int]], stage: int) -> list[MegatronBucket]:
    """The stage's buckets, each model chunk its own DDP buffer (interleaved 1F1B); the
    chunks' lists in backward order (the last chunk first), tensors indexed across them."""
    out, offset = [], 0
    for chunk in reversed(range(len(numels_by_chunk))):
        numels = numels_by_chunk[chunk]
        out += [MegatronBucket(bk.start + offset, bk.stop + offset, bk.elements)
                for bk in megatron_buckets(numels, bucket_capacity(s, stage, chunk), dp=s.parallel.dp,
                                           distributed_optimizer=config(s).distributed_optimizer)]
        offset += len(numels)
    return out


class MegatronPlanner(Planner):
    name = "megatron"
    per_module = True   # gradients become ready per parameter, as each module's backward ends

    def __init__(self, s: Scenario, layout: Layout, stage: int = 0) -> None:
        super().__init__(s, layout, stage)
        self.c = config(s)
        self.grad_bytes = grad_bytes(s)
        order = [(gi, n) for gi in reversed(range(len(self.granules))) for n in reversed(self.granules[gi].tensors)]
        by_chunk: list[list[int]] = [[] for _ in range(self.v)]
        for gi, n in order:
            by_chunk[self.chunk_of(self.granules[gi])].append(n)
        self.buckets = stage_buckets(s, by_chunk, stage)
        # the granule whose backward readies a bucket's last gradient, which is also the first
        # granule of the bucket the next forward needs: the lowest granule index in it
        self.owner = [min(order[i][0] for i in range(bk.start, bk.stop)) for bk in self.buckets]
        self.forward_order = sorted(range(len(self.buckets)), key=lambda k: (self.owner[k], -k))
        self.reductions: list[OpRef] = []
        self.gathers: dict[int, OpRef] = {}
        self.tp_overlap = self.c.tp_comm_overlap and layout.tp > 1
        self.block_start: OpRef | None = None
        self.tp_last: OpRef | None = None      # the newest overlapped TP collective

    def resident_allocations(self, census: list[TensorGroup]) -> Resident:
        return megatron_resident(self.s, census)

    @cached_property
    def padded(self) -> int:
        return sum(bk.elements for bk in self.buckets)

    def part_key(self, ms: int, direction: Direction) -> tuple[bool, bool]:
        """Micro-steps differ only in the first (parameter gathers) and the last (gradient sync)."""
        return (ms == 0, ms == self.boundary)

    def quiet(self, use: Use) -> bool:
        opens = self.c.overlap_param_gather and use.what is F and use.micro_step == 0
        closes = self.c.overlap_grad_reduce and use.what is B and use.micro_step == self.boundary
        return not ((opens or closes) and use.index in self.owner)

    # -- tensor parallelism ------------------------------------------------------------------
    def receive(self, ms: int, direction: Direction) -> None:
        """The overlapped TP collectives of a pass wait for the pipeline send it starts from,
        as its compute does."""
        super().receive(ms, direction)
        if self.tp_overlap and self.receives(direction):
            self.b.stream_receive(Stream.TP, self.incoming(direction, ms))

    def send(self, ms: int, direction: Direction) -> None:
        """A pipeline send leaves after the TP collectives that finish its tensor."""
        if self.tp_overlap and self.tp_last is not None:
            self.b.stream_wait(Stream.P2P, self.tp_last)
        super().send(ms, direction)

    def emit(self, use: Use) -> None:
        """Note where the compute of a block's pass starts (the TP overlap's cover begins)."""
        if self.tp_overlap and self._starts_block_pass(use):
            self.block_start = self.b.last(Stream.COMPUTE)
        super().emit(use)

    def _starts_block_pass(self, use: Use) -> bool:
        g = self.granules[use.index]
        if g.block is None:
            return False
        neighbour = use.index + (1 if use.what is B else -1)
        inside = 0 <= neighbour < len(self.granules) and self.granules[neighbour].block == g.block
        return not inside

    def tensor_parallel(self, use: Use, count: int) -> OpRef | None:
        """With `tp_comm_overlap`, a block's TP collectives run on their own stream from the
        start of the block's pass, and the compute stream waits for them before the next op;
        the embedding's reduction (not a TE GEMM) stays blocking."""
        g = self.granules[use.index]
        if not self.tp_overlap or g.block is None:
            return super().tensor_parallel(use, count)
        nbytes = self.elem(self.half) * self.t.seq_len * self.t.micro_batch * self.m.hidden
        phase = Phase.FWD if use.what is F else Phase.BWD
        last: OpRef | None = None
        for _ in range(count):
            for coll in (Coll.ALL_GATHER, Coll.REDUCE_SCATTER):
                last = self.collective(Stream.TP, coll, nbytes, f"TP {coll.value.replace('_', '-')} (overlapped)",
                                       phase, use.micro_step, axis=Axis.TP, deps=[self.block_start],
                                       layer=g.block, purpose="tensor parallel")
        self.wait_before_next_compute(last)
        self.tp_last = last
        return None

    # -- data parallelism --------------------------------------------------------------------
    def before_use(self, use: Use) -> list[OpRef | None]:
        """`overlap_param_gather`: the forward pre-hook of a bucket's first module waits for
        that bucket's all-gather and dispatches the next one."""
        if not (self.c.overlap_param_gather and use.what is F and use.micro_step == 0):
            return []
        waits: list[OpRef | None] = []
        for position, k in enumerate(self.forward_order):
            if self.owner[k] != use.index:
                continue
            self._dispatch_gather(position)
            waits.append(self.gathers[k])
            self._dispatch_gather(position + 1)
        return waits

    def _dispatch_gather(self, position: int) -> None:
        if position >= len(self.forward_order) or self.forward_order[position] in self.gathers:
            return
        k = self.forward_order[position]
        self.gathers[k] = self._gather(k, Stream.REDUCE, Phase.FWD, 0)

    def _gather(self, k: int, stream: Stream, phase: Phase, ms: int) -> OpRef:
        return self.collective(stream, Coll.ALL_GATHER, self.buckets[k].elements * self.elem(self.half),
                               "distributed optimizer parameter all-gather", phase, ms, purpose="param bucket")

    def after_use(self, use: Use, op: OpRef) -> None:
        if not (self.c.overlap_grad_reduce and use.what is B and use.micro_step == self.boundary):
            return
        for k, owner in enumerate(self.owner):
            if owner == use.index:
                self._reduce(k, Stream.REDUCE, op)

    def _reduce(self, k: int, stream: Stream, producer: OpRef | None) -> None:
        nbytes = self.buckets[k].elements * self.grad_bytes
        coll = Coll.REDUCE_SCATTER if self.c.distributed_optimizer else Coll.ALL_REDUCE
        self.reductions.append(self.collective(stream, coll, nbytes, f"gradient bucket {coll.value.replace('_', '-')}",
                                               Phase.BWD, self.boundary, deps=[producer], purpose="grad bucket"))

    def end_of_backward(self, ms: int) -> None:
        """`finalize_model_grads`: without overlap every bucket is reduced now, blocking;
        with it the compute stream waits for the reductions in flight."""
        if ms != self.boundary:
            return
        if not self.c.overlap_grad_reduce:
            for k in range(len(self.buckets)):
                self._reduce(k, Stream.COMPUTE, None)
            return
        self.wait_before_next_compute(self.reductions[-1] if self.reductions else None)

    def optimizer_step(self) -> None:
        if self.t.precision.value == "fp16":
            self.collective(Stream.COMPUTE, Coll.ALL_REDUCE, 4.0, "found-inf all-reduce", Phase.STEP,
                            self.boundary, purpose="overflow check")
        norm = self.grad_norm()
        params = self.padded / self.dp if self.c.distributed_optimizer else float(self.psi)
        tensors = sum(len(g.tensors) for g in self.granules)   # the shard's main params: about 1/dp of them
        tensors = -(-tensors // self.dp) if self.c.distributed_optimizer else tensors
        self.optimizer(GpuAdam(self.t.optimizer, tensors), params, [norm])
        if self.c.distributed_optimizer and not self.c.overlap_param_gather:
            for k in self.forward_order:
                self._gather(k, Stream.COMPUTE, Phase.STEP, self.boundary)

    def notes(self) -> list[str]:
        c = self.c
        what = "distributed optimizer (reduce-scatter + all-gather)" if c.distributed_optimizer else \
            "all-reduce, replicated optimizer"
        return [f"Megatron-Core: {what}; {len(self.buckets)} gradient bucket(s) on stage {self.stage_index}, "
                f"{grad_dtype(self.s)} gradients; overlap_grad_reduce={c.overlap_grad_reduce}, "
                f"overlap_param_gather={c.overlap_param_gather}, tp_comm_overlap={c.tp_comm_overlap}"]


def megatron_resident(s: Scenario, census: list[TensorGroup]) -> Resident:
    """Megatron's table (docs/source/distrib_optimizer.md): 16-bit parameter, fp32 or 16-bit
    gradient buffer, fp32 master + Adam m, v (12 B; 16 with 16-bit gradients, whose fp32
    copy the optimizer keeps; 8 B in fp32 training, with no master copy), the last divided
    by dp with the distributed optimizer (the buffer padded to lcm(dp, 128))."""
    c, dp = config(s), s.parallel.dp
    psi = census_numel(census)
    half = BYTES_PER_ELEMENT[s.training.precision.value]
    gb = grad_bytes(s)
    states = 8.0 if half == 4 else 12.0 + (4.0 if gb == 2 else 0.0)
    shard = float(psi)
    if c.distributed_optimizer:
        unit = math.lcm(dp, MEGATRON_BUCKET_ALIGN)
        shard = -(-psi // unit) * unit / dp
    return resident(s, [Alloc(Mem.PARAMS, f"{8 * half}-bit parameters", half * psi),
                        Alloc(Mem.GRADS, f"{grad_dtype(s)} gradient buffer", gb * psi),
                        Alloc(Mem.OPTIMIZER, "fp32 master, Adam m and v" if half < 4 else "Adam m and v",
                              states * shard)], [])


def megatron_volume(s: Scenario) -> dict[str, float]:
    """Gradient buckets once per step (all-reduce, or reduce-scatter + parameter all-gather
    with the distributed optimizer) and the clipping norm (sim.analytic.volumes)."""
    p = s.parallel
    chunks = chunk_tensors(s.model, p.tp, s.stages, p.virtual_stages, 0)
    padded = sum(bk.elements for bk in stage_buckets(s, [list(reversed(c)) for c in chunks], 0))
    return megatron_engine_volume(padded, s.parallel.dp, grad_bytes=grad_bytes(s),
                                  param_bytes=BYTES_PER_ELEMENT[s.training.precision.value],
                                  distributed_optimizer=config(s).distributed_optimizer,
                                  clipping=s.training.gradient_clipping > 0,
                                  fp16=s.training.precision.value == "fp16")


def megatron_limits(s: Scenario) -> None:
    """Megatron's argument checks: TP communication overlap needs sequence parallelism."""
    if config(s).tp_comm_overlap and not s.parallel.sequence_parallel:
        raise InputError(s.path or "scenario", "megatron.tp_comm_overlap",
                         "needs parallel.sequence_parallel = true (Megatron: 'Tensor parallel "
                         "communication/GEMM overlap can happen only when sequence parallelism is enabled')")


MEGATRON = EngineModel(
    name="megatron", summary="Megatron-Core DDP with bucketed gradient sync, optionally the distributed "
                             "optimizer and TP communication overlap",
    applies=lambda s: s.schedule_mode is ScheduleMode.IMPLEMENTED and s.engine is Engine.MEGATRON,
    planner=MegatronPlanner, resident=megatron_resident, volume=megatron_volume, check=megatron_limits)
