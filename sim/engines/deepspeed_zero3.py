"""DeepSpeed ZeRO-3 as implemented (stage3.py, partitioned_param_coordinator.py,
parameter_offload.py; reference 1.4).

Fetch unit: every module that owns parameters. Tensors with numel <= the persistence
threshold are persistent (replicated, gathered once after each step). Before a module runs
(forward, recompute and backward alike) its missing parameters are all-gathered in one
coalesced call on the all-gather stream and the compute stream waits for it; then, the
trace being known (steady state: the first iteration records it and does not prefetch),
the coordinator prefetches the next modules of the trace up to
min(max_live_parameters - available, prefetch_bucket_size) elements, in one call. Waiting
on in-flight parameters records a fetch event; with more than two outstanding the host
synchronizes the oldest. After a module, its parameters are
released unless used again within `max_reuse_distance` elements of trace. Gradients fill
the IPG bucket (flush on overflow of `reduce_bucket_size`), each bucket one
reduce_scatter_tensor on the reduce stream, at most two in flight before the host waits.
The step runs Adam on this rank's partition (or CPU-Adam with offload) and all-gathers
the persistent parameters, one collective per tensor, then synchronizes the device; no
other parameter gather follows the step. The host slices
per rank in Python: the first wait on a coalesced gather of several tensors unpacks it
(dp pieces per tensor, and a torch.cat copy on the compute stream), and each bucket's
reduce-scatter packs dp pieces per tensor (HostSpec.zero3_rank_piece). The reduce stream
copies each gradient into the IPG buffer, packs and pre-divides the bucket before its
reduce-scatter and copies the reduced partition out after it (`_staging_kernels`,
`partition_grads`). Not simulated: the cat's transient second copy of a gathered batch in
memory.
"""

from __future__ import annotations

from collections import deque
from functools import cached_property
from typing import NamedTuple

from sim.analytic import kernels as kn
from sim.analytic.comm import tensor_padded
from sim.analytic.placement import TensorGroup
from sim.core.enums import Axis, Coll, OffloadDevice, ScheduleMode, ZeroStage
from sim.engines.buckets import DeepSpeedBucket
from sim.engines.deepspeed_zero12 import deepspeed_dp_volume, no_partitioned_gradients_with_pipelines
from sim.engines.layout import Layout
from sim.engines.model import EngineModel
from sim.engines.offload import Zero3OffloadStep, cpu_share, delayed_update
from sim.engines.policies import GpuAdam
from sim.engines.resident import Resident
from sim.engines.schedule import Alloc, Mem, OpRef, Phase, Schedule, Stream
from sim.engines.skeleton import Planner
from sim.engines.uses import B, C, F, Use, UseKind
from sim.engines.zero3_memory import zero3_resident
from sim.engines.zeropp import ZeroPlusPlus, qgz_reduce
from sim.inputs.scenario import Scenario
from sim.inputs.zero_config import BLOCKING_OFFLOAD_VERSION, CURRENT_VERSION

MAX_ONGOING_FETCHES = 2     # partitioned_param_coordinator.py __max_ongoing_fetch_events
MAX_REDUCE_EVENTS = 2       # stage3.py max_param_reduce_events
FP32_BYTES = 4.0            # the host's gradient partition is fp32 (master_weights_and_grads_dtype)


class Fetch(NamedTuple):
    """What using a module gathers: its owner's partitioned parameters (a tied head uses the
    embedding's), their elements, the padded elements all-gathered and how many tensors."""

    owner: str
    numel: int
    padded: int
    tensors: int


class Zero3Planner(Planner):
    name = "deepspeed-zero3"
    per_module = True

    def __init__(self, s: Scenario, layout: Layout, stage: int = 0) -> None:
        super().__init__(s, layout, stage)
        assert self.s.zero is not None
        self.z = self.s.zero
        self.h = self.elem(self.half)
        self.persistent = self._persistent_tensors()
        # parameters each granule fetches: (owner name, gathered elements, padded elements)
        self.fetch: dict[int, Fetch] = {}
        for i, g in enumerate(self.granules):
            owner = g.shares or g.name
            own = self.granules[self._owner_index(owner)]
            numels = [n for j, n in enumerate(own.tensors) if (owner, j) not in self.persistent]
            if numels:
                self.fetch[i] = Fetch(owner, sum(numels), sum(tensor_padded(n, self.dp) for n in numels), len(numels))
        self.padded_total = sum(tensor_padded(n, self.dp) for g in self.granules for n in g.tensors)
        # the optimizer's partition: the tensors with gradients (LoRA: the adapters)
        self.padded_trainable = sum(tensor_padded(n, self.dp) for g in self.granules for n in g.grad_tensors)
        self.persistent_numel = sum(self.granules[self._owner_index(o)].tensors[j] for o, j in self.persistent)
        self.bucket = DeepSpeedBucket(self.z.reduce_bucket_size)
        self.bucket_padded = 0
        self.bucket_tensors = 0
        self.bucket_shapes: list[tuple[int, int]] = []   # the bucket's gradients, (numel, dims): qgZ reduces each
        self.container_hooks = 0     # hook pairs of containers entered since the last module use
        self.zpp = ZeroPlusPlus.of(self.z, self.h)
        # qgZ needs more than one node (stage3.py __avg_scatter_grads: else reduce_scatter_coalesced)
        rep = layout.representatives[stage]
        self.qgz = self.zpp.quantized_gradients and len(layout.group(Axis.DP_ACROSS, rep)) > 1
        self.released: set[str] = set()        # owners released once this step (hpZ: secondary partition made)
        self.to_unpack: dict[OpRef, tuple[int, int, int]] = {}   # gathers not yet waited for:
                                                                 # (elements, tensors, ranks)
        self.reductions: deque[OpRef] = deque()
        self.last_reduction: OpRef | None = None
        self.offload_copies: list[OpRef] = []
        opt = self.z.offload_optimizer
        # the share of the partition CPU-Adam steps: only its gradients go to the host
        self.cpu_share = cpu_share(self.padded_trainable / self.dp, self.z.sub_group_size, opt.ratio) if opt.enabled else 0.0
        self.delayed: OpRef | None = None     # the delayed update's last copy (start_of_step)
        self.hook_time: OpRef | None = None
        self._in_backward = False

    def resident_allocations(self, census: list[TensorGroup]) -> Resident:
        return zero3_resident(self.s, census)

    def _owner_index(self, name: str) -> int:
        return self._index_of[name]

    @cached_property
    def _index_of(self) -> dict[str, int]:
        return {g.name: i for i, g in reversed(list(enumerate(self.granules)))}

    def _persistent_tensors(self) -> set[tuple[str, int]]:
        """ds_persist: numel <= param_persistence_threshold, until model_persistence_threshold."""
        out: set[tuple[str, int]] = set()
        total = 0
        for g in self.granules:
            for j, n in enumerate(g.tensors):
                if n <= self.z.param_persistence_threshold and total + n <= self.z.model_persistence_threshold:
                    out.add((g.name, j))
                    total += n
        return out

    # -- fetching ---------------------------------------------------------------------------
    def build(self) -> Schedule:
        self.resident()
        self.start_of_step()
        for ms in range(self.t.grad_accum):
            self.micro_step(ms)
        self.optimizer_step()
        return Schedule(self.name, [self.b.finish()], self.notes() + self.lora_notes())

    def hook_calls(self, use: Use) -> int:
        """DeepSpeed's pre- and post-hooks (fetch and release bookkeeping, parameter_offload.py
        `_pre_forward_module_hook` / `_post_forward_module_hook` and the backward pair): one
        call pair per module use, plus one for each container entered just before it.
        DeepSpeed hooks every module, not only those that own parameters (v0.6.2 stage3.py and
        parameter_offload.py `_register_hooks_recursively` walk `module.children()`), so the
        root, each block and its attention and MLP containers run their pairs too, in forward,
        recompute and backward alike; their cost is paid before the module that follows."""
        calls, self.container_hooks = 1 + self.container_hooks, 0
        return calls

    def with_containers(self, trace: list[Use]) -> list[Use]:
        """DeepSpeed hooks every module, so a container (the root, a block, its attention and
        MLP) entered in forward or backward runs fetch_sub_module too: no parameters to
        fetch, but a prefetch point. Marked as uses 'C' with index -1."""
        out: list[Use] = []
        previous: list[str] = []
        for use in trace:
            if out and (use.what is B) != (out[-1].what is B) and out[-1].what is not C:
                previous = []                      # the backward pass enters from the root again
            here = list(self.granules[use.index].containers)
            fresh = [c for i, c in enumerate(here) if i >= len(previous) or previous[i] != c]
            out += [Use(C, -1, use.micro_step) for _ in fresh]
            out.append(use)
            previous = here
        return out

    def micro_step(self, ms: int) -> None:
        trace = self.with_containers(self.trace(ms))
        keys = [self.fetch.get(u.index) if u.what is not C else None for u in trace]
        available: dict[str, tuple[OpRef, int]] = {}     # owner -> (AG op, elements)
        skipped: dict[str, int] = {}                     # owner -> latest trace use passed by prefetch
        outstanding: deque[OpRef] = deque()              # fetch events the host has not synced
        inflight: set[str] = set()                       # gathered but not yet waited for
        n_available, queue = 0, 0
        passes = self.passes_of(trace)
        for pos, use in enumerate(trace):
            key = keys[pos]
            deps: list[OpRef] = []
            self._in_backward = passes[pos] is not F
            # The pre-hook of this use runs when the previous use's compute is done: gathers
            # issued here overlap this use's compute at most (host view of the allocator).
            self.hook_time = self.b.last(Stream.COMPUTE)
            if key and key[0] not in available:
                ag = self._all_gather([key], ms, use, "fetch")
                available[key[0]] = (ag, key[1])
                inflight.add(key[0])
                n_available += key[1]
            if key:
                deps.append(available[key[0]][0])
                if key[0] in inflight:   # waiting on an in-flight gather records a fetch event
                    inflight.discard(key[0])
                    outstanding.append(available[key[0]][0])
                    if len(outstanding) > MAX_ONGOING_FETCHES:
                        self.b.host_sync(outstanding.popleft())   # the host synchronizes the oldest
            queue = max(queue, pos + 1)
            budget = min(self.z.max_live_parameters - n_available, self.z.prefetch_bucket_size)
            batch, queue = self._prefetch_batch(keys, queue, available, skipped, budget)
            if batch:
                ag = self._all_gather(batch, ms, use, "prefetch")
                for k in batch:
                    available[k[0]] = (ag, k[1])
                    inflight.add(k[0])
                    n_available += k[1]
            for dep in deps:   # the compute stream waits for the gathers this use needs
                self.b.stream_wait(Stream.COMPUTE, dep)
                self._unpack(dep, ms, use)
            op = self._emit_use(use)
            if key and self._release(keys, pos, skipped):
                n_available -= available.pop(key[0])[1]
                self._free_after(op, key)
        for owner in list(available):   # release_and_reset_all at the end of backward
            self._free_after(self.b.last(Stream.COMPUTE), self._key_of(owner))
        self.end_of_backward(ms)

    @staticmethod
    def passes_of(trace: list[Use]) -> list[UseKind]:
        """The pass (forward, backward, ...) each use of `trace` belongs to: a container
        marker belongs to the next use's pass."""
        passes = [u.what for u in trace]
        for i in range(len(passes) - 2, -1, -1):
            if passes[i] is C:
                passes[i] = passes[i + 1]
        return passes

    def _key_of(self, owner: str) -> Fetch:
        return next(k for k in self.fetch.values() if k.owner == owner)

    def _prefetch_batch(self, keys: list[Fetch | None], queue: int, available: dict[str, tuple[OpRef, int]],
                        skipped: dict[str, int], budget: int) -> tuple[list[Fetch], int]:
        """Pop the trace queue until `budget` elements are being prefetched; a use whose
        parameters are already available is marked, so they are not released before it."""
        batch: list[Fetch] = []
        numel, chosen = 0, set()
        while queue < len(keys) and numel < budget:
            key = keys[queue]
            if key and key[0] in available:
                skipped[key[0]] = queue
            elif key and key[0] not in chosen:
                batch.append(key)
                chosen.add(key[0])
                numel += key[1]
            queue += 1
        return batch, queue

    def _release(self, keys: list[Fetch | None], pos: int, skipped: dict[str, int]) -> bool:
        """DeepSpeed's __params_to_release: keep parameters whose later use prefetch skipped,
        or that reappear among the modules visited before max_reuse_distance elements."""
        here = keys[pos]
        assert here is not None
        owner = here.owner
        if skipped.get(owner, -1) > pos:
            return False
        traversed = 0
        for key in keys[pos + 1:]:
            if traversed >= self.z.max_reuse_distance:
                break
            if key:
                if key[0] == owner:
                    return False
                traversed += key[1]
        return True

    def _all_gather(self, batch: list[Fetch], ms: int, use: Use, purpose: str) -> OpRef:
        padded = sum(k.padded for k in batch)
        deps: list[OpRef | None] = [self.hook_time]
        par = self.z.offload_param
        if par.enabled:
            read = self.copy(Stream.NVME_READ, self.h * padded / self.dp, "NVMe read of the parameter partition",
                             self._phase(use), ms, deps=deps) if par.device is OffloadDevice.NVME else None
            deps.append(self.copy(Stream.H2D, self.h * padded / self.dp, "H2D parameter partition",
                                  self._phase(use), ms, pageable=not par.pin_memory, deps=[read]))
        alloc = tuple(Alloc(Mem.PARAMS, f"gathered {k[0]}", self.h * k[2]) for k in batch)
        names = ", ".join(k[0] for k in batch) if len(batch) <= 3 else f"{len(batch)} modules"
        axis = self.zpp.gather_axis(batch[0].owner in self.released)   # hpZ: from the secondary partition
        ag = self.collective(Stream.ALLGATHER, Coll.ALL_GATHER, self.zpp.gather_bytes(padded), f"all-gather {names}",
                             self._phase(use), ms, deps=deps, alloc=alloc, axis=axis,
                             layer=self.granules[use.index].block, purpose=purpose)
        tensors = sum(k.tensors for k in batch)
        if tensors > 1 or self.zpp.quantized_weights:
            self.to_unpack[ag] = (sum(k.numel for k in batch), tensors, len(self.layout.group(axis, self.layout.representatives[self.stage_index])))
        return ag

    def _unpack(self, ag: OpRef, ms: int, use: Use) -> None:
        """The first wait on a coalesced gather of more than one tensor
        (partition_parameters.py `AllGatherCoalescedHandle.wait`) splits it back into
        parameters: per tensor, a Python loop over the ranks (narrow, append, record_stream)
        and one torch.cat of the dp pieces on the compute stream (a copy of every gathered
        element). A single tensor's gather lands in place (`AllGatherHandle`)."""
        gathered = self.to_unpack.pop(ag, None)
        if gathered is None:
            return
        elements, tensors, ranks = gathered
        copy = (kn.memory("torch.cat of the gathered pieces", 2.0 * self.h * elements),) if tensors > 1 else ()
        self.compute("unpack coalesced all-gather", self._phase(use), ms, self.zpp.dequantize_weights(elements) + copy,
                     self.granules[use.index].block if use.what is not C else None,
                     pieces=ranks * tensors if tensors > 1 else 0)

    def _phase(self, use: Use) -> Phase:
        return Phase.BWD if self._in_backward else Phase.FWD

    def _free_after(self, op: OpRef | None, key: Fetch) -> None:
        """Give the gathered copy back when compute op `op` ends (and, with hpZ, keep the
        secondary partition the release makes: later gathers of the step use it)."""
        self.b.attach(op, free=(Alloc(Mem.PARAMS, f"gathered {key[0]}", self.h * key[2]),))
        self.released.add(key[0])

    def _emit_use(self, use: Use) -> OpRef | None:
        if use.what is C:
            self.container_hooks += 1     # its hook pair runs with the next module's (hook_calls)
            return self.b.last(Stream.COMPUTE)
        self.emit(use)
        return self.b.last(Stream.COMPUTE)

    # -- gradients --------------------------------------------------------------------------
    def after_use(self, use: Use, op: OpRef) -> None:
        g = self.granules[use.index]
        if use.what is not B or g.shares:
            return
        for n, dims in reversed(g.grad_shapes):
            if self.bucket.add(n):   # the bucket overflowed: reduce what it held before n
                self._reduce_scatter(use.micro_step, op, g.block)
            self.bucket_padded += tensor_padded(n, self.dp)
            self.bucket_tensors += 1
            self.bucket_shapes.append((n, dims))

    def _reduce_scatter(self, ms: int, producer: OpRef | None, layer: int | None) -> None:
        """Reduce what the bucket holds except its newest gradient (DeepSpeed flushes first).
        coalesced_collectives.py `reduce_scatter_coalesced` first slices every tensor into dp
        chunks and interleaves them in Python: dp pieces per tensor on the host."""
        padded, pieces = self.bucket_padded, self.dp * self.bucket_tensors
        shapes = self.bucket_shapes
        self.bucket_padded = self.bucket_tensors = 0
        self.bucket_shapes = []
        numels = [n for n, _ in shapes]
        if self.qgz:   # qgZ replaces only the averaging scatter (`__avg_scatter_grads`)
            copy = self._ipg_copy(numels)
            staged = self.kernels_on(Stream.REDUCE, "copy gradients into the IPG bucket", Phase.BWD, ms, copy, layer,
                                     [producer]) if copy else producer
            rs = qgz_reduce(self, shapes, ms, staged, layer)
        else:
            staged = self.kernels_on(Stream.REDUCE, "stage the gradient bucket", Phase.BWD, ms,
                                     self._staging_kernels(padded, numels), layer, [producer])
            rs = self.collective(Stream.REDUCE, Coll.REDUCE_SCATTER, self.h * padded, "reduce_scatter bucket",
                                 Phase.BWD, ms, deps=[staged], layer=layer, purpose="grad bucket", pieces=pieces)
        if not self.z.offload_optimizer.enabled:   # offloaded, the partition goes through the host
            rs = self.kernels_on(Stream.REDUCE, "partition_grads", Phase.BWD, ms,
                                 (kn.memory("partition_grads copy / add", (3.0 if ms else 2.0) * self.h * padded
                                            / self.dp),), layer, [rs])
        if self.z.offload_optimizer.enabled:
            rs = self._through_the_host_buffer(rs, ms, layer, padded)
        self.last_reduction = rs
        self.reductions.append(rs)
        if len(self.reductions) > MAX_REDUCE_EVENTS:
            self.b.host_sync(self.reductions.popleft())
        if self.z.offload_optimizer.enabled and ms == self.boundary and self.cpu_share > 0:
            down = self._gradients_to_host(rs, ms, layer, padded)
            if self.z.offload_optimizer.device is OffloadDevice.NVME:   # the fp32 gradients swapped out
                down = self.copy(Stream.NVME_WRITE, self.cpu_share * FP32_BYTES * padded / self.dp,
                                 "NVMe swap-out of fp32 gradients", Phase.BWD, ms, deps=[down], layer=layer)
            self.offload_copies.append(down)

    def _ipg_copy(self, numels: list[int]) -> tuple[kn.Kernel, ...]:
        """stage3.py as of v0.19 `__add_grad_to_ipg_bucket`: each gradient is copied into the
        contiguous IPG buffer on the reduce stream, unless it alone exceeds
        `reduce_bucket_size` (then it is reduced where it lies). A read and a write."""
        copied = sum(n for n in numels if n <= self.z.reduce_bucket_size)
        return (kn.memory("IPG bucket copy", 2.0 * self.h * copied),) if copied else ()

    def _staging_kernels(self, padded: float, numels: list[int]) -> tuple[kn.Kernel, ...]:
        """The bucket's memory passes before its reduce-scatter: the IPG copy (`_ipg_copy`),
        then coalesced_collectives.py `reduce_scatter_coalesced` interleaves the per-rank
        chunks into a new flat tensor (`torch.cat`, skipped for one tensor that needs no
        padding) and pre-divides it in place (`div_`): a read and a write of the bucket each."""
        bucket = self.h * padded
        kernels = self._ipg_copy(numels)
        if len(numels) > 1 or numels[0] % self.dp:
            kernels += (kn.memory("reduce_scatter_coalesced torch.cat", 2.0 * bucket),)
        return kernels + (kn.memory("reduce_scatter_coalesced div_", 2.0 * bucket),)

    def _through_the_host_buffer(self, rs: OpRef | None, ms: int, layer: int | None, padded: float) -> OpRef:
        """With the optimizer offloaded, the reduced gradient partitions live in a host buffer
        (stage3.py: `self.device` is the CPU, `grad_partitions_flat_buffer` pinned when
        `pin_memory`; v0.6.2 and today alike). `partition_grads` copies each reduced partition
        into it (`copy_(non_blocking=True)`) and brings it back to the GPU (`.to(device,
        non_blocking=True)`) for the inf/nan check and the boundary's copy; on a later
        micro-step of an accumulation it brings the buffer to the GPU, adds, and copies the
        sum back. So every bucket costs one D2H and one H2D of the rank's partition in the
        16-bit accumulation dtype, per micro-step, on the reduce stream (pageable copies run
        at the staged rate). Returns the last copy, which the bucket's event follows."""
        nbytes = self.h * padded / self.dp
        pageable = not self.z.offload_optimizer.pin_memory
        first, second = (Stream.D2H, Stream.H2D) if ms == 0 else (Stream.H2D, Stream.D2H)
        names = {Stream.D2H: "D2H into the host gradient buffer",
                 Stream.H2D: "H2D from the host gradient buffer"}
        there = self.copy(first, nbytes, names[first], Phase.BWD, ms, stream=Stream.REDUCE, deps=[rs], layer=layer,
                          pageable=pageable)
        return self.copy(second, nbytes, names[second], Phase.BWD, ms, stream=Stream.REDUCE, deps=[there],
                         layer=layer, pageable=pageable)

    def _gradients_to_host(self, rs: OpRef | None, ms: int, layer: int | None, padded: float) -> OpRef:
        """At the accumulation boundary each reduced gradient partition goes to the host's fp32
        gradient (stage3.py `partition_grads`, on the reduce stream). Since v0.19.5 (PR #8207):
        cast to fp32 on the GPU, then a non-blocking copy of 4 B per element into the
        (pinned unless `pin_memory = false`) fp32 buffer. From v0.6.0 to v0.19.4:
        `fp32_grad_tensor.copy_(grad_buffer)`, a blocking copy across devices and dtypes,
        which torch makes a D2H of the 16-bit values into a fresh pageable tensor (at the
        host's `fresh_pageable_d2h` rate: Copy.fresh), then a cast on the CPU (aten
        copy_kernel_cuda); the host waits for it, so it cannot run
        ahead of the backward during the boundary micro-step. Not simulated: the GPU cast
        kernel (6 B per element on the reduce stream) and the CPU cast."""
        elements = self.cpu_share * padded / self.dp
        nvme = self.z.offload_optimizer.device is OffloadDevice.NVME   # swapped out from GPU fp32 tensors
        if self.z.deepspeed_version == BLOCKING_OFFLOAD_VERSION and not nvme:
            down = self.copy(Stream.D2H, self.h * elements, "D2H gradient partition (blocking, pageable)", Phase.BWD,
                             ms, stream=Stream.REDUCE, deps=[rs], layer=layer, pageable=True, fresh=True)
            self.b.host_sync(down)
            return down
        return self.copy(Stream.D2H, FP32_BYTES * elements, "D2H gradient partition (fp32)", Phase.BWD, ms,
                         stream=Stream.REDUCE, deps=[rs], layer=layer, pageable=not self.z.offload_optimizer.pin_memory)

    def end_of_backward(self, ms: int) -> None:
        if self.bucket.flush():
            self._reduce_scatter(ms, self.b.last(Stream.COMPUTE), None)
        self.b.host_sync(self.last_reduction)   # the backward epilogue synchronizes the reduce stream
        if self.offload_copies:
            self.b.host_sync(self.offload_copies[-1])
        self.reductions.clear()

    # -- the step ---------------------------------------------------------------------------
    def _offload_step(self) -> Zero3OffloadStep:
        opt, par = self.z.offload_optimizer, self.z.offload_param
        return Zero3OffloadStep(self.z.sub_group_size, opt.ratio, self.h, delayed=self.t.delayed_parameter_update,
                                nvme=opt.device is OffloadDevice.NVME, pipeline_read=opt.pipeline_read,
                                pipeline_write=opt.pipeline_write,
                                param_home=par.device.value if par.enabled else "gpu")

    def start_of_step(self) -> None:
        if self.z.offload_optimizer.enabled and self.t.delayed_parameter_update:
            self.delayed = delayed_update(self.b, self._offload_step(), self.boundary, self.padded_trainable / self.dp)

    def optimizer_step(self) -> None:
        # stage3.py step(): the global norm is always computed, in float64 (8 B all-reduce)
        norm = self.grad_norm(always=True, nbytes=8.0)
        shard = self.padded_trainable / self.dp
        if self.delayed is not None:      # the CPU path began with the step
            self.b.stream_wait(Stream.COMPUTE, self.delayed)
        elif self.z.offload_optimizer.enabled:
            self.optimizer(self._offload_step(), shard, [norm, *self.offload_copies])
        else:
            tile = min(shard, self.z.sub_group_size)
            groups = max(1, -(-int(shard) // int(tile))) if tile else 1   # one flat tensor per sub-group
            step = self.optimizer(GpuAdam(self.t.optimizer, groups, (Alloc(Mem.OPTIMIZER, "fp32 gradient sub-group",
                                                                            4.0 * tile),)), shard, [norm])
            self._write_back_parameters(step, self.padded_total / self.dp)
        padded = [tensor_padded(self.granules[self._owner_index(o)].tensors[j], self.dp)
                  for o, j in sorted(self.persistent, key=self._tensor_order)]
        if not padded:
            return
        # `_post_step` -> `all_gather(persistent_parameters)` -> `_allgather_params_coalesced`,
        # which despite its name launches one all_gather_into_tensor per parameter (each
        # paying the ring's latency, which grows with dp), then synchronizes the device
        # (partition_parameters.py, v0.6.2 to v0.19): the step's end, where the host and
        # every stream meet in the DES anyway
        for numel in padded:
            self.collective(Stream.COMPUTE, Coll.ALL_GATHER, self.h * numel, "all-gather persistent parameter",
                            Phase.STEP, self.boundary, purpose="post-step")

    def _write_back_parameters(self, step: OpRef, shard: float) -> None:
        """Parameters offloaded with the optimizer on the GPU: `_reassign_or_swap_out_partitioned_parameters`
        copies each updated sub-group into the host's 16-bit partition (a D2H), or swaps it
        out to NVMe; the next forward reads them back before its gathers."""
        par = self.z.offload_param
        if not par.enabled:
            return
        down = self.copy(Stream.D2H, self.h * shard, "D2H updated 16-bit partition", Phase.STEP, self.boundary,
                         deps=[step], pageable=not par.pin_memory)
        if par.device is OffloadDevice.NVME:
            down = self.copy(Stream.NVME_WRITE, self.h * shard, "NVMe swap-out of the 16-bit partition", Phase.STEP,
                             self.boundary, deps=[down])
        self.b.stream_wait(Stream.COMPUTE, down)

    def _tensor_order(self, key: tuple[str, int]) -> tuple[int, int]:
        return self._owner_index(key[0]), key[1]

    def notes(self) -> list[str]:
        return [f"ZeRO-3 steady state (trace recorded, prefetch on): {len(self.fetch)} fetch units, "
                f"{len(self.persistent)} persistent tensors ({self.persistent_numel:,} elements)"]


DEEPSPEED_ZERO3 = EngineModel(
    name="deepspeed-zero3", summary="DeepSpeed ZeRO-3 (stage3.py, partitioned_param_coordinator.py)",
    applies=lambda s: (s.schedule_mode is ScheduleMode.IMPLEMENTED and s.zero is not None
                       and s.zero.stage == ZeroStage.PARAMETERS
                       and s.zero.deepspeed_version in (CURRENT_VERSION, BLOCKING_OFFLOAD_VERSION)),
    planner=Zero3Planner, resident=zero3_resident, volume=deepspeed_dp_volume,
    check=no_partitioned_gradients_with_pipelines)
