"""DeepSpeed without ZeRO and with ZeRO-1 / ZeRO-2, as implemented
(deepspeed/runtime/zero/stage_1_and_2.py, engine.py; reference 1.3 and 1.5).

- Gradients go into the IPG bucket in hook order; a bucket is flushed when the next
  gradient would overflow `reduce_bucket_size` elements. Each flushed bucket is reduced
  with one all-reduce (default `use_multi_rank_bucket_allreduce`), with one reduce per
  destination rank when that flag is off, or a plain all-reduce with `reduce_scatter` off.
- ZeRO-2 reduces every micro-step; ZeRO-1 only at the accumulation boundary.
- `overlap_comm` off: the reduction runs in the hook on the compute stream (backward
  stalls for it; ZeRO-1 walks all gradients after backward). On: reductions run on the
  reduction stream, and when bucket k is launched the compute stream waits for bucket
  k-1: one bucket in flight.
- Step: grad-norm all-reduce, Adam on this rank's partition (GPU, or CPU-Adam with
  ZeRO-Offload: D2H of each reduced partition slice, CPU-Adam, H2D of the 16-bit
  partition), then one all_gather_into_tensor of the whole 16-bit flat buffer (padded to a
  multiple of 2 x dp) on the compute stream, overlapped with nothing.
- Stage 0 (DeepSpeed without ZeRO): after backward, at the boundary, all-reduce of all
  gradients in 5e8-element buckets on the compute stream; Adam on all parameters.
- BF16_Optimizer (deepspeed/runtime/bf16_optimizer.py; bf16 with ZeRO-1 and fp32
  gradient accumulation, or bf16 without ZeRO under a pipeline: Scenario.bf16_optimizer_bytes):
  after every micro-step's backward the 16-bit gradients are added into a full-size
  accumulation buffer and zeroed (`update_hp_grads`, `clear_lp_grads`: memory-bound); at the
  boundary that buffer is all-reduced in its own dtype in 5e8-element buckets on the
  compute stream (`buffered_allreduce_fallback`, pipe/engine.py `_bf16_reduce_grads`); Adam
  steps this rank's 1/dp of the fp32 master, the 16-bit partitions are all-gathered and the
  buffer cleared (`update_lp_params`, `clear_hp_grads`).
"""

from __future__ import annotations

from sim.analytic.comm import flat_padded
from sim.analytic.kernels import Kernel, memory
from sim.analytic.placement import TensorGroup, census_numel, rank_grad_shapes, rank_tensors, trainable
from sim.analytic.volumes import bf16_optimizer_volume, deepspeed_volume
from sim.analytic.zeropp import zeropp_implemented_volume
from sim.core.enums import Axis, Coll, ScheduleMode, ZeroStage
from sim.core.errors import InputError
from sim.core.units import BYTES_PER_ELEMENT
from sim.engines.buckets import DeepSpeedBucket
from sim.engines.layout import Layout
from sim.engines.model import EngineModel
from sim.engines.offload import DeepSpeedCpuAdam, delayed_update
from sim.engines.policies import GpuAdam
from sim.engines.resident import Resident, frozen_base, half_bytes, resident
from sim.engines.schedule import Alloc, Direction, Mem, OpRef, Phase, Stream
from sim.engines.skeleton import Planner
from sim.engines.uses import B, Use
from sim.inputs.scenario import Scenario

STAGE0_BUCKET = 500_000_000  # MEMORY_OPT_ALLREDUCE_SIZE (deepspeed/runtime/constants.py)


class Zero12Planner(Planner):
    name = "deepspeed-zero12"
    per_module = True   # gradient hooks fire per parameter, as each module's backward ends

    def __init__(self, s: Scenario, layout: Layout, stage: int = 0) -> None:
        super().__init__(s, layout, stage)
        assert self.s.zero is not None
        self.z = self.s.zero
        self.stage = self.z.stage
        self.offload = self.z.offload_optimizer.enabled
        self.accumulation = s.bf16_optimizer_bytes          # BF16_Optimizer's buffer dtype; 0: not it
        self.partitioned = self.stage >= ZeroStage.OPTIMIZER or bool(self.accumulation)
        self.comm_bytes = self.accumulation or self.elem(self.half)
        self.bucket = DeepSpeedBucket(STAGE0_BUCKET if self.stage == 0 or self.accumulation
                                      else self.z.reduce_bucket_size)
        self.in_flight: OpRef | None = None   # the last bucket reduction launched (overlap_comm)
        self.bucketed = 0                      # gradient elements reduced so far in this backward
        self.offload_copies: list[OpRef] = []
        self.delayed: OpRef | None = None     # the delayed update's last copy (start_of_step)
        self.padded = flat_padded(self.grad_psi, self.dp)   # the optimizer's flat partition (trainable tensors)

    def resident_allocations(self, census: list[TensorGroup]) -> Resident:
        return zero12_resident(self.s, census)

    def name_of_stage(self) -> str:
        if self.accumulation:
            return f"BF16_Optimizer ({'fp32' if self.accumulation == 4 else 'bf16'} gradient accumulation)"
        return f"ZeRO-{int(self.stage)}" if self.stage else "DeepSpeed (no ZeRO)"

    # -- gradient reduction ----------------------------------------------------------------
    def reduces_now(self, ms: int) -> bool:
        return self.stage == ZeroStage.GRADIENTS or ms == self.boundary

    def part_key(self, ms: int, direction: Direction) -> tuple[bool, bool]:
        """Micro-steps differ only in whether gradients are reduced (and the first one)."""
        return (ms == 0, self.reduces_now(ms))

    def quiet(self, use: Use) -> bool:
        """Only backward hooks act, and only when gradients are reduced in them now."""
        return use.what is not B or not (self.in_hooks() and self.reduces_now(use.micro_step))

    def in_hooks(self) -> bool:
        return not self.accumulation and (self.stage == ZeroStage.GRADIENTS
                                          or (self.stage == ZeroStage.OPTIMIZER and self.z.overlap_comm))

    def after_use(self, use: Use, op: OpRef) -> None:
        if use.what is not B or not self.in_hooks() or not self.reduces_now(use.micro_step):
            return
        g = self.granules[use.index]
        for numel in reversed(g.grad_tensors):
            for elements in self.bucket.add(numel):
                self.reduce_bucket(elements, use.micro_step, op, g.block)

    def end_of_backward(self, ms: int) -> None:
        if self.accumulation:    # update_hp_grads: read 16-bit, read and write the buffer; clear_lp_grads
            self.compute("accumulate 16-bit gradients into the buffer (update_hp_grads)", Phase.BWD, ms,
                         (memory("update_hp_grads", self.grad_psi * (self.elem(self.half) * 2 + 2 * self.accumulation)),),
                         None)
        if not self.reduces_now(ms):
            return
        last = self.b.last(Stream.COMPUTE)
        if not self.in_hooks():   # ZeRO-0 / ZeRO-1 without overlap: walk every gradient now
            for g in reversed(self.granules):
                for numel in reversed(g.grad_tensors):
                    for elements in self.bucket.add(numel):
                        self.reduce_bucket(elements, ms, last, g.block)
        for elements in self.bucket.flush():
            self.reduce_bucket(elements, ms, last, None)
        self.b.host_sync(self.in_flight)   # epilogue: device synchronize
        self.b.host_sync(self.offload_copies[-1] if self.offload_copies else None)
        self.in_flight = None
        self.bucketed = 0

    def reduce_bucket(self, elements: int, ms: int, producer: OpRef | None, layer: int | None) -> None:
        overlap = self.z.overlap_comm and self.stage > 0 and not self.accumulation
        stream = Stream.REDUCE if overlap else Stream.COMPUTE
        nbytes = elements * self.comm_bytes
        owners = self._owners(elements)
        self.bucketed += elements
        copied = self._copy_into_bucket(elements, ms, producer, layer)   # in the hooks, before the flush
        if overlap:
            self.wait_before_next_compute(self.in_flight)   # compute waits for bucket k-1
        staged = self._average_and_flatten(elements, owners, ms, copied, layer, stream)
        last: OpRef | None = None
        if self.in_hooks() and self.z.reduce_scatter and not self.z.use_multi_rank_bucket_allreduce:
            for _dst in range(self.dp):
                last = self.collective(stream, Coll.REDUCE, nbytes / self.dp, "bucket reduce to owner",
                                       Phase.BWD, ms, deps=[staged], layer=layer, purpose="grad bucket")
        else:
            last = self.collective(stream, Coll.ALL_REDUCE, nbytes, "bucket all-reduce", Phase.BWD, ms,
                                   deps=[staged], layer=layer, purpose="grad bucket")
        last = self._unstage_bucket(elements, owners, ms, last, layer, stream)
        self.in_flight = last
        if self.offload and ms == self.boundary:
            # issued on the reduction's stream ("a separate copy stream is disabled because of race
            # with reduce", stage_1_and_2.py)
            self.offload_copies.append(self.copy(Stream.D2H, nbytes / self.dp, "D2H gradient partition",
                                                 Phase.BWD, ms, stream=stream, deps=[last], layer=layer,
                                                 pageable=not self.z.offload_optimizer.pin_memory))

    def _owners(self, elements: int) -> int:
        """How many ranks' partitions the bucket's elements fall in. Gradients arrive in
        reverse parameter order, so the bucket covers the `elements` before the ones bucketed
        so far in this backward, counted from the end of the flat buffer that the
        optimizer cuts into dp equal partitions (one parameter group)."""
        end = max(self.grad_psi - self.bucketed, elements)
        size = self.padded / self.dp
        return int((end - 1) // size) - int((end - elements) // size) + 1

    def _copies_grads(self) -> bool:
        """ZeRO-1/2's own optimizer (not stage 0's engine all-reduce, not BF16_Optimizer) moves
        every reduced gradient through its contiguous IPG bucket."""
        return self.stage > 0 and not self.accumulation

    def _copy_into_bucket(self, elements: int, ms: int, producer: OpRef | None, layer: int | None) -> OpRef | None:
        """stage_1_and_2.py as of v0.19: each gradient's hook copies it into the IPG bucket
        (`reduce_independent_p_g_buckets_and_remove_grads`, `new_grad_tensor.copy_`) on the
        compute stream, before the bucket is flushed; a gradient larger than the bucket is
        reduced where it lies. A read and a write: memory-bound."""
        if not self._copies_grads() or elements > self.z.reduce_bucket_size:
            return producer
        return self.compute("copy gradients into the IPG bucket", Phase.BWD, ms,
                            (memory("IPG bucket copy", 2.0 * elements * self.comm_bytes),), layer, [producer])

    def _average_and_flatten(self, elements: int, owners: int, ms: int, copied: OpRef | None, layer: int | None,
                             stream: Stream) -> OpRef | None:
        """With `reduce_scatter`, `average_tensor` divides the bucket by dp in place
        (`tensor.div_`) on the reduction stream and merges neighbouring slices bound for the
        same rank; when the bucket spans more than one rank's partition, `allreduce_bucket`
        flattens its slices into a new tensor (`torch.cat`; one slice is flattened to a view).
        A read and a write of the bucket each."""
        if not self._copies_grads() or not self.z.reduce_scatter:
            return copied
        bucket = elements * self.comm_bytes
        kernels: tuple[Kernel, ...] = (memory("average_tensor div_", 2.0 * bucket),)
        if owners > 1:
            kernels += (memory("allreduce_bucket flatten (torch.cat)", 2.0 * bucket),)
        return self.kernels_on(stream, "average and flatten the bucket", Phase.BWD, ms, kernels, layer, [copied])

    def _unstage_bucket(self, elements: int, owners: int, ms: int, reduced: OpRef | None, layer: int | None,
                        stream: Stream) -> OpRef | None:
        """After the reduction: with `reduce_scatter` and a flattened bucket, each rank copies
        its own slices back into the bucket (`allreduce_and_copy_with_multiple_ranks`,
        `buf.copy_(synced)`; an unflattened slice is the same memory, and torch skips the
        copy); without it, `gradient_reduction_w_predivide` post-scales the whole bucket by
        1/dp (`mul_`). Then each rank copies the gradients of its partition out of the bucket
        (`copy_grads_in_partition`; with ZeRO-Offload they go to the host instead:
        reduce_bucket). Per rank on average 1/dp of the bucket is its own."""
        if not self._copies_grads():
            return reduced
        bucket = elements * self.comm_bytes
        kernels: tuple[Kernel, ...] = ()
        if not self.z.reduce_scatter:
            kernels += (memory("gradient_reduction_w_predivide mul_", 2.0 * bucket),)
        elif owners > 1:
            kernels += (memory("copy back own slices", 2.0 * bucket / self.dp),)
        if not self.offload:
            kernels += (memory("copy_grads_in_partition", 2.0 * bucket / self.dp),)
        if not kernels:
            return reduced
        return self.kernels_on(stream, "copy this rank's reduced slices into its partition", Phase.BWD, ms,
                               kernels, layer, [reduced])

    # -- the step --------------------------------------------------------------------------
    def _partition(self) -> float:
        return self.padded / (self.dp if self.partitioned else 1)

    def _offload_step(self) -> DeepSpeedCpuAdam:
        return DeepSpeedCpuAdam(self._partition() * self.elem(self.half), pageable=not self.z.offload_optimizer.pin_memory,
                                delayed=self.t.delayed_parameter_update)

    def start_of_step(self) -> None:
        if self.offload and self.t.delayed_parameter_update:
            self.delayed = delayed_update(self.b, self._offload_step(), self.boundary, self._partition())

    def optimizer_step(self) -> None:
        # stage_1_and_2.py step(): fp16 checks overflow (a MAX all-reduce), then always computes
        # the global norm (scaled_global_norm, an fp32 all-reduce), clipping or not.
        if self.stage > 0 and self.t.precision.value == "fp16":
            self.collective(Stream.COMPUTE, Coll.ALL_REDUCE, 4.0, "overflow check all-reduce", Phase.STEP,
                            self.boundary, purpose="overflow check")
        norm = self.grad_norm(always=self.partitioned)
        shard = self._partition()
        # BF16_Optimizer steps on a view of its accumulation buffer; ZeRO-1/2 build an fp32 partition
        fp32_grads = () if self.accumulation else (Alloc(Mem.OPTIMIZER, "fp32 gradient partition", 4.0 * shard),)
        if self.delayed is not None:      # the CPU path began with the step
            self.b.stream_wait(Stream.COMPUTE, self.delayed)
        elif self.offload:
            self.optimizer(self._offload_step(), shard, [norm, *self.offload_copies])
        else:
            self.optimizer(GpuAdam(self.t.optimizer, 1, fp32_grads), shard, [norm])   # one flat partition
        if self.partitioned:
            self.collective(Stream.COMPUTE, Coll.ALL_GATHER, self.padded * self.elem(self.half),
                            "all_gather_into_tensor (16-bit partitions)", Phase.STEP, self.boundary,
                            purpose="post-step")
        if self.accumulation:    # clear_hp_grads
            self.compute("clear the gradient accumulation buffer (clear_hp_grads)", Phase.STEP, self.boundary,
                         (memory("clear_hp_grads", self.accumulation * self.padded),), None)

    def notes(self) -> list[str]:
        return [f"{self.name_of_stage()}: one parameter group; overlap_comm={self.z.overlap_comm}"]


def zero12_resident(s: Scenario, census: list[TensorGroup]) -> Resident:
    z, h, stage, dp = s.zero, half_bytes(s), s.zero_stage, s.parallel.dp
    assert z is not None
    psi = census_numel(trainable(census))     # the optimizer's parameters (LoRA: the adapters)
    padded = flat_padded(psi, dp)
    n = dp if stage >= ZeroStage.OPTIMIZER or s.bf16_optimizer_bytes else 1
    offload = z.offload_optimizer.enabled
    device = [*frozen_base(census, value_bytes=h), Alloc(Mem.PARAMS, "16-bit parameters", h * psi)]
    if s.bf16_optimizer_bytes:   # 16-bit gradients kept (zeroed, not freed), the full-size buffer, 1/dp fp32 state
        device += [Alloc(Mem.GRADS, "16-bit gradients", h * padded),
                   Alloc(Mem.GRADS, "gradient accumulation buffer (BF16_Optimizer)", s.bf16_optimizer_bytes * padded),
                   Alloc(Mem.OPTIMIZER, "fp32 master parameters", 4.0 * padded / n),
                   Alloc(Mem.OPTIMIZER, "Adam m and v", 8.0 * padded / n)]
        return resident(s, device, [])
    if not (offload and stage >= ZeroStage.GRADIENTS):
        device.append(Alloc(Mem.GRADS, "16-bit gradients", h * padded / (dp if stage >= ZeroStage.GRADIENTS else 1)))
    host: list[Alloc] = []
    if offload:
        pinned = "pinned" if z.offload_optimizer.pin_memory else "pageable"
        host.append(Alloc(Mem.OPTIMIZER, f"fp32 master, Adam m and v, fp32 gradients ({pinned})", 16.0 * padded / n))
        if s.training.delayed_parameter_update:
            host.append(Alloc(Mem.GRADS, "second fp32 gradient partition (delayed update)", 4.0 * padded / n))
    else:
        device += [Alloc(Mem.OPTIMIZER, "fp32 master parameters", 4.0 * padded / n),
                   Alloc(Mem.OPTIMIZER, "Adam m and v", 8.0 * padded / n)]
    if stage > 0:
        device.append(Alloc(Mem.BUFFERS, "IPG bucket", (2 if z.overlap_comm else 1) * h * z.reduce_bucket_size))
    return resident(s, device, host)


def zero12_volume(s: Scenario) -> dict[str, float]:
    """Bucketed all-reduces (every micro-step at ZeRO-2), the step's norm, the post-step
    all-gather (sim.analytic.volumes.deepspeed_volume)."""
    return deepspeed_dp_volume(s)


def deepspeed_dp_volume(s: Scenario) -> dict[str, float]:
    t, z = s.training, s.zero
    assert z is not None
    if z.zero_quantized_weights or z.zero_quantized_gradients or z.zero_hpz_partition_size > 1:
        return zeropp_dp_volume(s)
    p = s.parallel
    tensors = rank_tensors(s.model, p.tp, s.stages, 0)
    grads = [n for n, _ in rank_tensors(s.model, p.tp, s.stages, 0, trainable_only=True)] if s.model.lora else None
    if s.bf16_optimizer_bytes:
        return bf16_optimizer_volume(sum(grads if grads is not None else (n for n, _ in tensors)), p.dp,
                                     accumulation_bytes=s.bf16_optimizer_bytes,
                                     elem=BYTES_PER_ELEMENT[t.precision.value])
    return deepspeed_volume(tensors, p.dp, int(z.stage), grad_tensors=grads,
                            grad_accum=t.grad_accum, elem=BYTES_PER_ELEMENT[t.precision.value],
                            clipping=t.gradient_clipping > 0, persistence_threshold=z.param_persistence_threshold,
                            multi_rank_allreduce=not (z.reduce_scatter and not z.use_multi_rank_bucket_allreduce),
                            recompute_share=recompute_share(s), fp16=t.precision.value == "fp16")


def recompute_share(s: Scenario) -> float:
    """The share of the first stage's blocks whose forward full recomputation runs again."""
    plan, blocks = s.training.recompute_plan, s.stages.counts()[0]
    return plan.recomputed(blocks) / blocks if plan and blocks else 0.0


def no_partitioned_gradients_with_pipelines(s: Scenario) -> None:
    """DeepSpeed's PipelineEngine asserts ZeRO stage < 2 (deepspeed/runtime/pipe/engine.py)."""
    assert s.zero is not None
    if s.zero.stage >= ZeroStage.GRADIENTS and s.parallel.pp > 1:
        raise InputError(s.path or "scenario", "zero.stage", f"ZeRO-{int(s.zero.stage)} is incompatible with "
                         f"pipeline parallelism (pp = {s.parallel.pp}) in DeepSpeed; allowed: 0, 1")


DEEPSPEED_ZERO012 = EngineModel(
    name="deepspeed-zero012", summary="DeepSpeed without ZeRO and with ZeRO-1 / ZeRO-2 (stage_1_and_2.py)",
    applies=lambda s: (s.schedule_mode is ScheduleMode.IMPLEMENTED and s.zero is not None
                       and s.zero.stage < ZeroStage.PARAMETERS),
    planner=Zero12Planner, resident=zero12_resident, volume=zero12_volume,
    check=no_partitioned_gradients_with_pipelines)


def zeropp_dp_volume(s: Scenario) -> dict[str, float]:
    """ZeRO-3 with ZeRO++ (sim.analytic.zeropp.zeropp_implemented_volume), plus the step's norm."""
    from sim.engines.layout import Layout
    t, z, p = s.training, s.zero, s.parallel
    assert z is not None
    layout = Layout(p.tp, p.pp, p.dp, s.gpus_per_node)
    rep = layout.representatives[0]
    out = zeropp_implemented_volume(
        rank_tensors(s.model, p.tp, s.stages, 0), p.dp, grad_accum=t.grad_accum, elem=BYTES_PER_ELEMENT[t.precision.value],
        persistence_threshold=z.param_persistence_threshold, recompute_share=recompute_share(s),
        quantized_weights=z.zero_quantized_weights, hierarchical=z.zero_hpz_partition_size > 1,
        quantized_gradients=z.zero_quantized_gradients, node_ranks=len(layout.group(Axis.DP_NODE, rep)),
        nodes=len(layout.group(Axis.DP_ACROSS, rep)), grad_shapes=rank_grad_shapes(s.model, p.tp, s.stages, 0))
    out["all_reduce"] = 2 * (p.dp - 1) / p.dp * 8.0 if p.dp > 1 else 0.0   # the step's fp64 norm
    return {k: v for k, v in out.items() if v}
