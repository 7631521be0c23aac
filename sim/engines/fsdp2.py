"""PyTorch FSDP2, `fully_shard` on every transformer block and on the root
(torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py; reference 2.1-2.3).

Parameters are sharded on dim 0 (padded to a multiple of dp rows) and kept in their
original dtype (fp32); the all-gather and the unsharded copy use `param_dtype`. The root
group (embedding, final norm, head) is not resharded after forward unless `reshard_root`
is true (`fully_shard(root, reshard_after_forward=True)`): then it is freed after the head's
forward and gathered again when backward begins. Forward: block i's
all-gather runs on the all-gather stream and may start once block i - prefetch - 1 has
been resharded (implicit CPU run-ahead: two all-gather buffers alive at depth 1).
Backward: each block gathers itself (when resharded) and `backward_prefetch` blocks
ahead; after its gradients, a reduce-scatter on the reduce-scatter stream, and the compute
stream waits for the previous block's reduce-scatter before going on (one in flight).
Gradient sync happens every micro-step (the default). Adam runs on the fp32 shard.

With pipeline stages (torch.distributed.pipelining, as torchtitan composes it): blocks are
not resharded after forward (torchtitan's default with PP), so a stage gathers each unit
once, in its first micro-batch's forward, and keeps it; each micro-batch's backward runs
with gradient sync and reshard-after-backward off (stage.py `backward_maybe_with_nosync`),
accumulating unsharded gradients in the reduce dtype; after the stage's last backward the
schedule's REDUCE_GRAD action calls every group's post_backward in turn (stage.py
`perform_reduce_grad`: root first, then the blocks): reduce-scatter and reshard, one after
another, then the gradients are divided by the micro-batch count (`scale_grads`).

FSDP1 (`[fsdp] version = 1`, `FullyShardedDataParallel` with a FlatParameter per unit)
runs the same units, gathers and reduce-scatters, with three differences as implemented
(torch/distributed/fsdp/_flat_param.py, _runtime_utils.py):
- the all-gather writes the padded unsharded FlatParameter itself and the module's
  parameters are views of it (`_use_unsharded_views`): no copy-out;
- autograd's split backward flattens the unit's gradients into the FlatParameter's
  gradient on the compute stream (the same bytes as FSDP2's copy-in), and `_post_backward_hook`
  reduce-scatters it on the post-backward stream with `record_stream`: the compute stream
  never waits for an earlier reduce-scatter;
- the optimizer sees one flat parameter per unit (`use_orig_params=False`, the default).
Its rate limiter (`limit_all_gathers`, two all-gathers in flight) is forward_prefetch 1,
BackwardPrefetch.BACKWARD_PRE is backward_prefetch 1, and BACKWARD_POST (`prefetch_post`)
issues the next unit's all-gather from the unit's post-backward hook instead of its
pre-backward hook: after its backward ops and before its reduce-scatter, in the host's issue
order (_runtime_utils.py `_post_backward_reshard`). Both gathers of unit i - 1 wait for unit
i + 1's backward. From the post-backward hook that is the rate limiter's doing
(_limiter_utils.py `_FreeEventQueue`: `_unshard` synchronizes on the oldest of two pending
reshard events, and this hook reshards unit i before it prefetches). From the pre-backward
hook the limiter would let it start after unit i + 2's reshard (unit i + 1 has not yet
resharded), but the gather follows unit i + 1's reduce-scatter on the process group's NCCL
communicator, which runs its collectives one at a time in issue order (ProcessGroupNCCL's
one stream per group; NCCL serializes a communicator's collectives, pytorch/pytorch#137390),
and that reduce-scatter starts when unit i + 1's backward ends (the builder queues every
collective of the group behind the previous one: sim.engines.skeleton `QUEUED_GROUPS`).
A host that runs ahead of the device issues it in time either way; a host-bound one issues
it a unit's backward later.
"""

from __future__ import annotations

from sim.analytic.comm import dim0_padded
from sim.analytic.kernels import memory
from sim.analytic.placement import TensorGroup, tp_shape, trainable
from sim.analytic.volumes import fsdp2_engine_volume
from sim.core.enums import Axis, Coll, Engine, ScheduleMode
from sim.core.errors import InputError
from sim.core.model import ModuleSpec, module_tree
from sim.core.units import BYTES_PER_ELEMENT
from sim.engines.layout import Layout
from sim.engines.model import EngineModel
from sim.engines.policies import GpuAdam, TorchCpuAdam
from sim.engines.resident import Resident, resident
from sim.engines.schedule import Alloc, Mem, OpRef, Phase, Stream
from sim.engines.skeleton import Planner
from sim.engines.uses import B, F, R, Use
from sim.inputs.scenario import Scenario
from sim.inputs.scenario_tables import BACKWARD_PREFETCH_NAMES
from sim.inputs.schema import NOT_SIMULATED_YET

TORCH_CPU_ADAM_SLOWDOWN = 6.0  # DeepSpeedCPUAdam is "5x to 7x" faster than torch Adam (cpu_adam.py)


class Fsdp2Planner(Planner):
    name = "fsdp2"

    def __init__(self, s: Scenario, layout: Layout, stage: int = 0) -> None:
        super().__init__(s, layout, stage)
        f = self.s.fsdp
        assert f is not None
        self.f = f
        self.shard = layout.shard or layout.dp          # ranks a parameter is sharded over (HSDP: dp / r)
        self.replicas = layout.dp // self.shard
        self.shard_axis = Axis.DP_SHARD if self.replicas > 1 else Axis.DP   # plain FSDP: the whole dp group
        self.post = f.post_forward                      # int reshard_after_forward: k, else 0
        self.flat = f.version == 1                      # FSDP1: FlatParameter gathered in place
        self.p_bytes = self.elem(f.param_dtype or self.half)
        self.r_bytes = self.elem(f.reduce_dtype or f.param_dtype or self.half)
        self.padded = self._padded_by_unit()          # unit index -> padded elements
        self.grad_padded = self._padded_by_unit(trainable_only=True)   # of them, with gradients (LoRA)
        self.total_padded = sum(self.padded.values())
        self.ag: dict[tuple[int, int, Phase], OpRef] = {}  # (micro-step, unit, pass) -> AG op
        self.fwd_done: dict[int, OpRef] = {}
        self.bwd_done: dict[int, OpRef] = {}
        self.prev_rs: OpRef | None = None
        self.last_rs: OpRef | None = None
        self.pipelined = layout.pp > 1
        self.accumulating: set[int] = set()             # units whose unsharded gradients accumulate (PP)
        self.blocking = s.cluster.host.synchronous       # a CPU process: c10d calls block (`_blocking_call`)
        # units gathered ahead from the pre-backward hook (BACKWARD_POST: none; the post-backward hook does)
        self.pre_backward_prefetch = 0 if f.prefetch_post else f.backward_prefetch

    def resident_allocations(self, census: list[TensorGroup]) -> Resident:
        return fsdp2_resident(self.s, census)

    def _padded_by_unit(self, trainable_only: bool = False) -> dict[int, int]:
        """Unit -1 is the root (embedding, final norm, head: of them, what this pipeline
        stage holds); unit i is block i."""
        out: dict[int, int] = {}
        for mod in module_tree(self.m):
            if not self._holds(mod):
                continue
            unit = -1 if mod.block is None else mod.block
            out[unit] = out.get(unit, 0) + sum(dim0_padded(tp_shape(mod, t.shape, self.layout.tp), self.shard)
                                               for t in mod.tensors if t.trainable or not trainable_only)
        return out

    def _holds(self, mod: ModuleSpec) -> bool:
        """Does this pipeline stage hold `mod`? Its blocks; the embedding on the first stage,
        the final norm and head on the last (sim.engines.skeleton `_on_this_stage`)."""
        if mod.block is not None:
            return self.split.stage_of(mod.block) == self.stage_index
        return self.stage_index == (0 if mod.kind == "embedding" else self.layout.pp - 1)

    def hook_calls(self, use: Use) -> int:
        """FSDP2's pre- and post-hooks of the unit (`FSDPParamGroup.pre_forward` /
        `post_forward` and the backward pair: unshard, wait, reshard bookkeeping)."""
        return 1

    def unit_of(self, use: Use) -> int:
        block = self.granules[use.index].block
        return -1 if block is None else block

    def resharded(self, unit: int) -> bool:
        """Blocks follow `reshard_after_forward`; the root follows `reshard_root` (torch's
        default None keeps it unsharded after forward)."""
        if unit == -1:
            return bool(self.f.reshard_root)
        return bool(self.f.reshard_after_forward)

    # -- all-gathers ------------------------------------------------------------------------
    def gathered_in(self, ms: int) -> int:
        """The micro-step whose all-gather a unit uses in micro-step `ms`: its own, or with
        pipeline stages the first (units stay gathered for the whole step)."""
        return 0 if self.pipelined else ms

    def before_use(self, use: Use) -> list[OpRef | None]:
        unit, ms = self.unit_of(use), self.gathered_in(use.micro_step)
        if use.what is F:
            if (ms, unit, Phase.FWD) in self.ag:
                return [self.ag[(ms, unit, Phase.FWD)]]     # the head (root still gathered); a kept unit
            return self._copy_out(use, self._gather(ms, unit, Phase.FWD))
        if use.what is R:
            if unit == -1:
                return []
            ag = self._gather(ms, unit, Phase.BWD)
            return self._copy_out(use, ag) if (ms, unit, Phase.BWD) in self.ag else [ag]
        if unit == -1 and not self.resharded(-1):
            return [self.ag[(ms, -1, Phase.FWD)]]
        if unit == -1:       # the resharded root is gathered again as backward begins (the head)
            fresh = (ms, -1, Phase.BWD) not in self.ag
            return self._copy_out(use, self._gather(ms, -1, Phase.BWD)) if fresh else [self.ag[(ms, -1, Phase.BWD)]]
        ag = self._gather(ms, unit, Phase.BWD)
        for ahead in range(1, min(self.pre_backward_prefetch, unit) + 1):   # explicit backward prefetch
            self._gather(ms, unit - ahead, Phase.BWD)
        # a unit gathered again for backward is copied out when used; one kept since forward is ready
        return self._copy_out(use, ag) if (ms, unit, Phase.BWD) in self.ag else [ag]

    def _copy_out(self, use: Use, ag: OpRef | None) -> list[OpRef | None]:
        """`foreach_all_gather_copy_out` on the compute stream: the gathered flat buffer is
        copied into the unsharded parameters (read + write, memory-bound). FSDP1 has none:
        its parameters are views of the gathered FlatParameter."""
        if ag is None:
            return []
        if self.flat:
            return [ag]
        unit = self.unit_of(use)
        nbytes = 2.0 * self.p_bytes * self.padded[unit]
        name = f"all-gather copy-out unit {unit}"
        return [self.compute(name, Phase.FWD if use.what is F else Phase.BWD, use.micro_step,
                             (memory(name, nbytes),), None if unit == -1 else unit, [ag])]

    def _gather(self, ms: int, unit: int, phase: Phase) -> OpRef | None:
        ms = self.gathered_in(ms)
        key = (ms, unit, phase)
        if key in self.ag:
            return self.ag[key]
        if phase is Phase.BWD and not self.resharded(unit):
            return self.ag.get((ms, unit, Phase.FWD))
        if phase is Phase.FWD:   # buffer of block unit - prefetch - 1 must be resharded first
            gate = self.fwd_done.get(unit - self.f.forward_prefetch - 1)
        elif unit != -1:   # the root's backward gather opens backward: nothing to wait for
            gate = self.bwd_done.get(unit + self.f.backward_prefetch + 1)
        else:
            gate = None
        nbytes = self.p_bytes * self.padded[unit]
        deps: list[OpRef | None] = [gate]
        if self.f.cpu_offload:
            deps.append(self.copy(Stream.H2D, 4.0 * self.padded[unit] / self.shard, "H2D parameter shard",
                                  phase, ms))
        from_post = phase is Phase.BWD and self.post and unit != -1   # from the post-forward k-way shards
        deps += self._issued_after()
        self.ag[key] = self.collective(
            Stream.ALLGATHER, Coll.ALL_GATHER, nbytes, f"all-gather {'root' if unit == -1 else f'block {unit}'}",
            phase, ms, deps=deps, layer=None if unit == -1 else unit, axis=Axis.DP_POST if from_post else self.shard_axis,
            alloc=(Alloc(Mem.PARAMS, f"unsharded unit {unit}", nbytes),),
            free=(self._post_shard(unit),) if from_post else (), purpose="fetch" if unit != -1 else "root")
        self._blocking_call(self.ag[key])
        return self.ag[key]

    def _issued_after(self) -> list[OpRef | None]:
        """On a synchronous host a collective starts where the program calls it: after the
        compute issued before it (the calling thread ran that compute)."""
        return [self.b.last(Stream.COMPUTE)] if self.blocking else []

    def _blocking_call(self, op: OpRef) -> None:
        """FSDP calls its all-gathers (`unshard_async_op` False by default), reduce-scatters and
        HSDP all-reduces without `async_op` (_fsdp_collectives.py `foreach_all_gather`,
        `foreach_reduce`; FSDP1: _flat_param.py `_all_gather_flat_param`, _runtime_utils.py
        `_reduce_grad`), so c10d waits for each Work before returning. With NCCL that wait is
        a stream wait and the host goes on at once; with gloo on a CPU process (a synchronous
        host) the calling thread blocks until the collective has ended, so nothing it issues
        later runs beside it: prefetching does not overlap there."""
        if self.blocking:
            self.b.host_sync(op)

    def _post_shard(self, unit: int) -> Alloc:
        """What a rank keeps of a unit between forward and backward with an int
        reshard_after_forward k: 1/k of it, in the parameter dtype."""
        return Alloc(Mem.PARAMS, f"post-forward shard unit {unit}", self.p_bytes * self.padded[unit] / self.post)

    # -- after compute: reshard, reduce-scatter -------------------------------------------------
    def after_use(self, use: Use, op: OpRef) -> None:
        unit, ms = self.unit_of(use), use.micro_step
        if use.what is F and unit != -1:
            if self.post:   # post_forward: copy this rank's 1/k slice out of the unsharded unit, then free it
                name = f"post-forward reshard unit {unit}"
                op = self.compute(name, Phase.FWD, ms, (memory(name, 2.0 * self._post_shard(unit).nbytes),), unit,
                                  alloc=(self._post_shard(unit),))
            self.fwd_done[unit] = op
            if self.resharded(unit):
                self._free(op, unit)
        if use.what is F and unit == -1 and use.index > 0 and self.resharded(-1):
            self._free(op, -1)   # the root's post-forward reshard, after the head
        if use.what is B and self.pipelined:
            self._accumulate(op, unit)
            return
        if use.what is not B or (unit == -1 and use.index != 0):
            return
        self.bwd_done[unit] = op
        self._free(op, unit)   # reshard after backward
        if not self.grad_padded[unit]:   # a unit of frozen parameters only (LoRA): nothing to reduce
            return
        grads = Alloc(Mem.GRADS, f"unsharded gradients unit {unit}", self.p_bytes * self.grad_padded[unit])
        self.b.attach(op, alloc=(grads,))
        self._reduce(unit, ms, grads)

    def _accumulate(self, op: OpRef, unit: int) -> None:
        """Pipeline stages: the unit's first backward allocates its unsharded gradients,
        accumulated in the reduce dtype until the stage's REDUCE_GRAD (torch's FSDPParam
        `to_accumulated_grad_if_needed`)."""
        if unit in self.accumulating or not self.grad_padded[unit]:
            return
        self.accumulating.add(unit)
        self.b.attach(op, alloc=(self._accumulated(unit),))

    def _accumulated(self, unit: int) -> Alloc:
        return Alloc(Mem.GRADS, f"accumulated unsharded gradients unit {unit}", self.r_bytes * self.grad_padded[unit])

    def _reduce(self, unit: int, ms: int, grads: Alloc, release: tuple[Alloc, ...] = ()) -> None:
        """post_backward's foreach_reduce: after the previous reduce-scatter (one in flight), a
        copy-in on the compute stream (which also frees `release`: the resharded unit), the
        reduce-scatter (freeing `grads`) and, with HSDP, the shard's all-reduce; with CPU
        offload the shard's D2H. FSDP1: the gradient is flattened by autograd and the compute
        stream does not wait for the previous reduce-scatter; with BACKWARD_POST its hook
        issues the next unit's all-gather between the two."""
        nbytes = self.r_bytes * self.grad_padded[unit]
        if not self.flat:
            self.wait_before_next_compute(self.prev_rs)   # at most one reduce-scatter outstanding
        name = f"{'gradient flatten' if self.flat else 'reduce-scatter copy-in'} unit {unit}"
        copy_in = self.compute(name, Phase.BWD, ms, (memory(name, 2.0 * nbytes),), None if unit == -1 else unit,
                               free=release)
        if self.f.prefetch_post and unit > 0:   # BACKWARD_POST: the hook gathers the next unit first
            self._gather(ms, unit - 1, Phase.BWD)
        rs = self.collective(Stream.REDUCE, Coll.REDUCE_SCATTER, nbytes,
                             f"reduce-scatter {'root' if unit == -1 else f'block {unit}'}", Phase.BWD, ms,
                             deps=[copy_in], layer=None if unit == -1 else unit, free=(grads,), purpose="grad",
                             axis=self.shard_axis)
        self._blocking_call(rs)
        self.prev_rs, self.last_rs = rs, rs
        if self.replicas > 1:   # HSDP: the shard's gradient all-reduced over the replicas (foreach_reduce)
            self.last_rs = self.collective(Stream.ALLREDUCE, Coll.ALL_REDUCE, nbytes / self.shard,
                                           f"all-reduce {'root' if unit == -1 else f'block {unit}'} shard", Phase.BWD,
                                           ms, deps=[rs], layer=None if unit == -1 else unit, purpose="grad",
                                           axis=Axis.DP_REPLICATE)
            self._blocking_call(self.last_rs)
        if self.f.cpu_offload:
            self.last_rs = self.copy(Stream.D2H, 4.0 * self.grad_padded[unit] / self.shard, "D2H gradient shard",
                                     Phase.BWD, ms, deps=[self.last_rs])

    def _free(self, op: OpRef, unit: int) -> None:
        nbytes = self.p_bytes * self.padded[unit]
        self.b.attach(op, free=(Alloc(Mem.PARAMS, f"unsharded unit {unit}", nbytes),))

    def end_of_backward(self, ms: int) -> None:
        if self.pipelined and ms == self.boundary:
            self._reduce_grad(ms)
        elif self.pipelined:
            return                                     # no gradient sync before the last micro-batch
        self.wait_before_next_compute(self.last_rs)   # finalize_backward waits for the reductions
        self.prev_rs = None

    def _reduce_grad(self, ms: int) -> None:
        """The pipeline schedule's REDUCE_GRAD after the stage's last backward: each unit's
        post_backward in turn (root first, then the blocks), resharding it and reducing its
        accumulated gradients; `_root_post_backward_final_callback` then waits for them (the
        caller), and `scale_grads` divides the sharded gradients by the micro-batch count."""
        for unit in sorted(self.padded):
            params = Alloc(Mem.PARAMS, f"unsharded unit {unit}", self.p_bytes * self.padded[unit])
            if unit in self.accumulating:
                self._reduce(unit, ms, self._accumulated(unit), release=(params,))
            else:
                self.compute(f"reshard unit {unit}", Phase.BWD, ms, (), None if unit == -1 else unit, free=(params,))
        if self.t.grad_accum > 1:
            shard = sum(self.grad_padded.values()) / self.shard
            self.compute("scale gradients by the micro-batch count", Phase.BWD, ms,
                         (memory("scale gradients", 8.0 * shard),), None, [self.last_rs])

    def optimizer_step(self) -> None:
        norm = self.grad_norm()
        shard = sum(self.grad_padded.values()) / self.shard
        if self.f.cpu_offload:
            self.optimizer(TorchCpuAdam(TORCH_CPU_ADAM_SLOWDOWN), shard, [norm, self.last_rs])
        else:
            # FSDP2: one DTensor shard per parameter; FSDP1: one flat parameter per unit
            tensors = sum(1 for n in self.grad_padded.values() if n) if self.flat else sum(len(g.grad_tensors) for g in self.granules)
            self.optimizer(GpuAdam(self.t.optimizer, tensors), shard, [norm])

    def notes(self) -> list[str]:
        return [f"FSDP{self.f.version}: {self.m.layers} block units + root; reshard_after_forward={self.f.reshard_after_forward}, "
                f"forward_prefetch={self.f.forward_prefetch}, backward_prefetch="
                f"{'BACKWARD_POST' if self.f.prefetch_post else self.f.backward_prefetch}"]


def fsdp2_resident(s: Scenario, census: list[TensorGroup]) -> Resident:
    assert s.fsdp is not None
    dp = s.parallel.dp // s.fsdp.replicate_degree       # the shard group
    shard = sum(dim0_padded(g.local_shape, dp) * g.count for g in trainable(census)) / dp
    frozen = sum(dim0_padded(g.local_shape, dp) * g.count for g in census if not g.trainable) / dp
    base = [Alloc(Mem.PARAMS, "frozen 16-bit base shards (LoRA)", 2.0 * frozen)]
    if s.fsdp.cpu_offload:
        return resident(s, [], [*base, Alloc(Mem.OPTIMIZER, "fp32 parameter, gradient and Adam shards "
                                             "(CPUOffloadPolicy)", 16.0 * shard)])
    return resident(s, [*base, Alloc(Mem.PARAMS, "fp32 parameter shards", 4.0 * shard),
                        Alloc(Mem.GRADS, "fp32 gradient shards", 4.0 * shard),
                        Alloc(Mem.OPTIMIZER, "Adam m and v", 8.0 * shard)], [])


def fsdp2_volume(s: Scenario) -> dict[str, float]:
    """Per block and root: forward all-gathers, backward all-gathers of what was resharded
    (the root too with `reshard_root`), one reduce-scatter per unit, every micro-step."""
    f, t = s.fsdp, s.training
    assert f is not None
    p = BYTES_PER_ELEMENT[f.param_dtype or t.precision.value]
    r = BYTES_PER_ELEMENT[f.reduce_dtype or f.param_dtype or t.precision.value]
    return fsdp2_engine_volume(s.model, s.parallel.dp, grad_accum=t.grad_accum, param_bytes=p, reduce_bytes=r,
                               reshard_after_forward=bool(f.reshard_after_forward), reshard_root=bool(f.reshard_root),
                               clipping=t.gradient_clipping > 0, replicate=f.replicate_degree, post=f.post_forward,
                               tp=s.parallel.tp, pp=s.stages)


def fsdp2_limits(s: Scenario) -> None:
    """FSDP2 is simulated over data-parallel meshes (FSDP, HSDP), with tensor parallelism
    (torchtitan's 2D) and with pipeline stages as torchtitan composes them (blocks and root
    kept gathered: reshard_after_forward false, reshard_root not true; untied embeddings; no
    CPU offload). HSDP's
    replicate degree divides dp, and an int reshard_after_forward is a non-trivial divisor
    of the shard group (torch: 'a factor of the mesh shard dim size', not 1 nor it)."""
    source = s.path or "scenario"
    f, dp = s.fsdp, s.parallel.dp
    assert f is not None
    if f.version == 1:
        fsdp1_limits(s)
    elif f.prefetch_post:
        raise InputError(source, "fsdp.backward_prefetch", "\"BACKWARD_POST\" is FSDP1's BackwardPrefetch; FSDP2 "
                         "prefetches from its pre-backward hook only; allowed with version = 2: an int >= 0 or "
                         "\"BACKWARD_PRE\" (or set version = 1)")
    if s.parallel.pp > 1:
        problems = [(key, what) for key, what, present in (
            ("fsdp.reshard_after_forward", "reshard_after_forward other than false (torchtitan's default with "
                                           "pipelines)", f.reshard_after_forward is not False),
            ("fsdp.cpu_offload", "cpu_offload", f.cpu_offload),
            ("fsdp.reshard_root", "reshard_root = true", f.reshard_root is True),
            ("model.tie_word_embeddings", "tied embeddings", s.model.tied_embeddings)) if present]
        if problems:
            key, what = problems[0]
            raise InputError(source, key, f"pp = {s.parallel.pp} with FSDP2 and {what}: {NOT_SIMULATED_YET}; "
                             "allowed: pipelines with reshard_after_forward = false, no cpu_offload, the root kept "
                             "(reshard_root left out or false), untied embeddings")
    if dp % f.replicate_degree:
        raise InputError(source, "fsdp.replicate_degree", f"{f.replicate_degree} does not divide the data-parallel "
                         f"degree ({dp}); allowed: a divisor of {dp}")
    shard, k = dp // f.replicate_degree, f.post_forward
    if k and (shard % k or not 1 < k < shard):
        raise InputError(source, "fsdp.reshard_after_forward", f"{k}: resharding after forward to {k}-way groups "
                         f"needs a divisor of the shard group ({shard}) other than 1 and {shard}; allowed: true, "
                         f"false or such a divisor")


def fsdp1_limits(s: Scenario) -> None:
    """What FullyShardedDataParallel cannot express, refused: an int reshard_after_forward
    (its ShardingStrategy reshards fully or not at all), a resharded root (`_post_forward_reshard`
    never frees the root's FlatParameter), prefetch deeper than one unit (the rate limiter's two
    all-gathers in flight; BackwardPrefetch names one unit), pipeline stages (torchtitan composes
    fully_shard), and LoRA (a FlatParameter mixing frozen and trainable tensors)."""
    f = s.fsdp
    assert f is not None
    problems = (
        ("fsdp.reshard_after_forward", "an int reshard_after_forward", f.post_forward != 0,
         "true (FULL_SHARD) or false (SHARD_GRAD_OP)"),
        ("fsdp.reshard_root", "reshard_root = true", f.reshard_root is True, "left out or false"),
        ("fsdp.forward_prefetch", f"forward_prefetch = {f.forward_prefetch}", f.forward_prefetch > 1, "0 or 1"),
        ("fsdp.backward_prefetch", f"backward_prefetch = {f.backward_prefetch}", f.backward_prefetch > 1,
         "0, 1 or one of " + ", ".join(BACKWARD_PREFETCH_NAMES)),
        ("parallel.pp", f"pp = {s.parallel.pp}", s.parallel.pp > 1, "1 (pipelines compose FSDP2: version = 2)"),
        ("lora", "LoRA adapters", s.model.lora is not None, "no [lora] table (or version = 2)"))
    for key, what, present, allowed in problems:
        if present:
            raise InputError(s.path or "scenario", key, f"{what} with FSDP1 ([fsdp] version = 1): "
                             f"{NOT_SIMULATED_YET}; allowed: {allowed}")


FSDP2 = EngineModel(
    name="fsdp2", summary="PyTorch FSDP2, fully_shard per transformer block and on the root",
    applies=lambda s: s.schedule_mode is ScheduleMode.IMPLEMENTED and s.engine is Engine.FSDP2,
    planner=Fsdp2Planner, resident=fsdp2_resident, volume=fsdp2_volume, check=fsdp2_limits)
