"""The forward / backward skeleton every strategy shares, with hooks for its communication.

A micro-step is a sequence of uses of compute granules: forward F(g) in model order, then
per block in reverse: recompute R(g) (full recomputation, forward order) and backward B(g).
Backward of a granule is two ops, input gradient then weight gradient; a granule's
gradients are ready when its weight-gradient op ends. Activations of a block are taken at
its first forward op and given back at its last backward op (sizes from
sim.analytic.activations, so the DES and the analytic twin agree). Strategies override
the hooks to add collectives, copies and their ordering constraints.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from functools import cached_property

from sim.analytic import activations as act
from sim.analytic.kernels import Kernel
from sim.analytic.placement import TensorGroup, stage_census
from sim.core.enums import Axis, Coll, KernelStyle, LossImpl
from sim.core.model import Role
from sim.core.units import BYTES_PER_ELEMENT
from sim.engines.builder import Builder
from sim.engines.checkpointing import Checkpointing
from sim.engines.deepspeed_pipe import DeepSpeedPipe
from sim.engines.layout import Layout
from sim.engines.policies import OptimizerPlacement, Part, pipeline_order
from sim.engines.resident import Resident
from sim.engines.schedule import Alloc, Direction, Mem, OpRef, Phase, PipeTag, Schedule, Stream
from sim.engines.uses import B, F, R, Use
from sim.engines.workload import EMBEDDINGS, Unit, blocks, float8_tp, shape_of, units
from sim.inputs.scenario import Scenario

QUEUED_GROUPS = frozenset({Axis.DP, Axis.DP_SHARD})
"""Process groups whose collectives run one at a time, in issue order. Before PyTorch's
PR #150398 (2025) every collective of a ProcessGroupNCCL ran on the group's one internal
stream; since, a synchronous one runs on the caller's stream, and NCCL still serializes a
communicator's collectives (pytorch/pytorch#137390). FSDP's all-gathers and reduce-scatters,
DeepSpeed's fetches and gradient buckets, DDP's and Megatron's buckets and the distributed
optimizer's gathers share the data-parallel group (FSDP2's HSDP: the shard group); so a
gather issued behind a reduce-scatter waits for it instead of sharing the links with it.
Not queued: TP (Megatron's overlapped TP runs on userbuffers, not NCCL), the groups ZeRO++
splits the data-parallel ranks into (several process groups map to each of those axes),
HSDP's replicate group and FSDP2's post-forward mesh (alone on their streams); nor gloo on
a CPU process, whose host blocks in each collective (a synchronous host)."""


class Planner(Checkpointing, DeepSpeedPipe):
    """Base planner: subclasses choose granules and fill in the hooks."""

    name = "base"
    per_module = False   # ZeRO-3 plans per module; the others per block

    def __init__(self, s: Scenario, layout: Layout, stage: int = 0, granules: Sequence[Unit] | None = None) -> None:
        self.s, self.layout, self.stage_index = s, layout, stage
        self.m, self.t, self.dp = s.model, s.training, layout.dp
        self.v = s.parallel.virtual_stages                  # model chunks per stage (interleaved 1F1B)
        self.split = s.stages                               # blocks per stage (sim.analytic.stages)
        self.per_chunk = self.split.counts()[stage] if self.v == 1 else self.m.layers // (layout.pp * self.v)
        self.chunk = 0                                      # the local model chunk being planned
        self.b = Builder()
        if not s.cluster.host.synchronous:
            self.b.queued_groups = QUEUED_GROUPS
        self._activation_bytes: dict[act.Recompute, float] = {}
        all_units = units(self.m, shape_of(s, layout.tp))
        if granules is None:
            granules = all_units if self.per_module else blocks(all_units)
        self.granules: list[Unit] = [g for g in granules if self._on_this_stage(g)]
        self.psi = sum(u.numel for u in self.granules)   # parameters per TP rank
        self.grad_psi = sum(u.grad_numel for u in self.granules)   # of them, those with gradients (LoRA: adapters)
        self.boundary = self.t.grad_accum - 1

    def _on_this_stage(self, g: Unit) -> bool:
        """Pipeline stage k holds blocks [k L/pp, (k+1) L/pp); the first also the embedding,
        the last the final norm and head (Megatron's uniform split). With v model chunks per
        stage (interleaved 1F1B) the model is cut into p v chunks of L / (p v) blocks and
        stage k holds chunks k, k + p, k + 2p, ... (megatron/core/transformer/
        transformer_block.py `get_num_layers_to_build`, its layer offset). Without chunks the
        split may give the end stages other counts (`first_stage_layers`, `last_stage_layers`)."""
        pp = self.layout.pp
        if g.block is not None and self.v == 1:
            return self.split.stage_of(g.block) == self.stage_index
        if g.block is not None:
            return (g.block // self.per_chunk) % pp == self.stage_index
        return self.stage_index == (0 if g.role in EMBEDDINGS else pp - 1)

    def chunk_start(self, chunk: int) -> int:
        """The first model block of this stage's local chunk `chunk`."""
        if self.v == 1:
            return self.split.blocks(self.stage_index).start
        return (chunk * self.layout.pp + self.stage_index) * self.per_chunk

    def chunk_of(self, g: Unit) -> int:
        """The local model chunk of granule `g` (the embedding in the first, the head in the last)."""
        if g.block is None:
            return 0 if g.role in EMBEDDINGS else self.v - 1
        if self.v == 1:
            return 0
        return (g.block // self.per_chunk) // self.layout.pp

    @property
    def global_chunk(self) -> int:
        """The chunk being planned, counted along the whole pipeline."""
        return self.chunk * self.layout.pp + self.stage_index

    # -- sizes -----------------------------------------------------------------------------
    def elem(self, dtype: str) -> int:
        return BYTES_PER_ELEMENT[dtype]

    @cached_property
    def half(self) -> str:
        """16-bit dtype of mixed precision (fp32 when training in fp32)."""
        return self.t.precision.value

    # -- op helpers ------------------------------------------------------------------------
    def wait_before_next_compute(self, ref: OpRef | None) -> None:
        """The compute stream's next op waits for `ref` (a CUDA stream wait)."""
        self.b.stream_wait(Stream.COMPUTE, ref)

    def compute(self, name: str, phase: Phase, ms: int, kernels: tuple[Kernel, ...], layer: int | None,
                deps: Iterable[OpRef | None] = (), *, alloc: tuple[Alloc, ...] = (),
                free: tuple[Alloc, ...] = (), join: bool = False, hooks: int = 0, pieces: int = 0) -> OpRef:
        return self.b.compute(name, phase, ms, kernels=kernels, layer=layer, deps=deps, alloc=alloc, free=free,
                              join=join, hooks=hooks, pieces=pieces)

    def kernels_on(self, stream: Stream, name: str, phase: Phase, ms: int, kernels: tuple[Kernel, ...],
                   layer: int | None, deps: Iterable[OpRef | None] = ()) -> OpRef:
        """Kernels the framework launches on `stream`. A CPU process has no streams (its
        accelerator's stream context is a no-op: the copy runs inline in the calling thread),
        so on a synchronous host they go on the compute stream, as they do for `COMPUTE`."""
        if stream is Stream.COMPUTE or self.s.cluster.host.synchronous:
            return self.compute(name, phase, ms, kernels, layer, deps)
        return self.b.side_compute(stream, name, phase, ms, kernels=kernels, layer=layer, deps=deps)

    def collective(self, stream: Stream, coll: Coll, nbytes: float, name: str, phase: Phase, ms: int, *,
                   axis: Axis = Axis.DP, deps: Iterable[OpRef | None] = (), layer: int | None = None,
                   alloc: tuple[Alloc, ...] = (), free: tuple[Alloc, ...] = (), purpose: str = "",
                   pieces: int = 0) -> OpRef:
        return self.b.collective(stream, coll, nbytes, name, phase, ms, axis=axis, layer=layer, deps=deps,
                                 alloc=alloc, free=free, purpose=purpose, pieces=pieces)

    # -- the skeleton ----------------------------------------------------------------------
    def trace(self, ms: int) -> list[Use]:
        """The order in which granules are used in micro-step `ms`: every forward, then block
        by block from the last: backward in reverse, and before the backward of a recompute
        segment's last block the forward of the whole segment again, in forward order
        (sim.analytic.recompute: every block its own segment, chunks of N, or the first N)."""
        uses = [Use(F, i, ms) for i in range(len(self.granules))]
        i = len(self.granules) - 1
        while i >= 0:
            block = self.granules[i].block
            j = i
            while j > 0 and block is not None and self.granules[j - 1].block == block:
                j -= 1
            segment = self.segment_of(block)
            if segment is not None and block == segment[-1]:   # the segment's granules end at i
                uses += [Use(R, k, ms) for k in range(self._first_granule[segment[0]], i + 1)]
            uses += [Use(B, k, ms) for k in range(i, j - 1, -1)]
            i = j - 1
        return uses

    @cached_property
    def _first_granule(self) -> dict[int, int]:
        """Model block -> the index of its first granule (a block's granules are contiguous)."""
        first: dict[int, int] = {}
        for k, g in enumerate(self.granules):
            if g.block is not None:
                first.setdefault(g.block, k)
        return first

    def build(self) -> Schedule:
        self.resident()
        self.start_of_step()
        if self.deepspeed_pipeline:
            self.deepspeed_instructions()
        else:
            for ms, part, chunk in self.pipeline_order():
                self.chunk = chunk
                if part is not Part.BACKWARD:
                    self.part(ms, Direction.FORWARD)
                if part is not Part.FORWARD:
                    self.part(ms, Direction.BACKWARD)
        self.optimizer_step()
        return Schedule(self.name, [self.b.finish()], self.notes() + self.lora_notes())

    def part(self, ms: int, direction: Direction, *, exchange: bool = True, end_hook: bool = True) -> None:
        """The forward or the backward of micro-step `ms`: receive, the uses, send (and the
        end-of-backward hook); replayed from an identical earlier part when there is one.
        `exchange` False: no receive and send (DeepSpeed's pipeline issues them itself);
        `end_hook` False: the caller runs the end-of-backward hook later."""
        key = self.part_key(ms, direction) if end_hook else None
        if key is not None and self.v > 1:
            key = (self.chunk, key)
        if key is not None and self.b.replay((direction, key), ms):
            return
        self.b.begin_part()
        uses = self.trace(ms)
        if self.v > 1:   # this model chunk's granules only
            uses = [u for u in uses if self.chunk_of(self.granules[u.index]) == self.chunk]
        split = next(i for i, u in enumerate([*uses, Use(B, -1, ms)]) if u.what is not F)
        if exchange:
            self.receive(ms, direction)
        for use in uses[:split] if direction is Direction.FORWARD else uses[split:]:
            self.emit(use)
        if exchange:
            self.send(ms, direction)
        if direction is Direction.BACKWARD and self.chunk == 0 and end_hook:   # the micro-step's last backward chunk
            self.end_of_backward(ms)
        if key is not None:
            self.b.end_part((direction, key), ms)

    def part_key(self, ms: int, direction: Direction) -> Hashable | None:
        """Parts with the same key plan the same ops, up to the micro-step number, and leave
        the planner's state as they found it (so the builder may replay them); None: plan
        this part afresh. The base planner promises nothing; tests/unit/test_part_replay.py
        checks every planner that does against planning every part."""
        return None

    def pipeline_order(self) -> list[tuple[int, Part, int]]:
        """Micro-batch (and model chunk) order of this stage (sim.engines.policies: 1F1B with
        pipelining, interleaved with virtual stages)."""
        return pipeline_order(self.layout.pp, self.v).order(self.t.grad_accum, self.layout.pp, self.stage_index)

    def activation_bytes_between_stages(self) -> float:
        """s b h activations of the training dtype (16-bit in mixed precision, 4 B in fp32),
        /t with sequence parallelism."""
        p = self.s.parallel
        return self.elem(self.half) * self.t.seq_len * self.t.micro_batch * self.m.hidden / (p.tp if p.sequence_parallel else 1)

    def receives(self, direction: Direction) -> bool:
        """Does this stage's pass in `direction` (of the chunk being planned) start from a
        neighbouring stage's send?"""
        last = self.layout.pp * self.v - 1
        return (direction is Direction.FORWARD and self.global_chunk > 0) or \
            (direction is Direction.BACKWARD and self.global_chunk < last)

    def incoming(self, direction: Direction, ms: int) -> PipeTag:
        """The send a pass in `direction` waits for: the previous chunk's forward, or the
        next chunk's backward, along the whole pipeline."""
        return PipeTag(direction, ms, self.global_chunk + (-1 if direction is Direction.FORWARD else 1))

    def receive(self, ms: int, direction: Direction) -> None:
        """The next compute op waits for the neighbouring stage's send."""
        if self.receives(direction):
            self.b.stream_receive(Stream.COMPUTE, self.incoming(direction, ms))

    def send(self, ms: int, direction: Direction) -> None:
        """Activations to the next chunk's stage, gradients to the previous one's (wrapping
        from the last stage to the first between interleaved chunks)."""
        last = self.layout.pp * self.v - 1
        forward = direction is Direction.FORWARD
        if (forward and self.global_chunk < last) or (not forward and self.global_chunk > 0):
            peer = 1 if forward else -1
            to = (self.stage_index + peer) % self.layout.pp
            self.b.send(f"send {'activations' if forward else 'gradients'} to stage {to}",
                        Phase.FWD if forward else Phase.BWD, ms, nbytes=self.activation_bytes_between_stages(),
                        tag=PipeTag(direction, ms, self.global_chunk), peer=peer, deps=[self.b.last(Stream.COMPUTE)])

    def emit(self, use: Use) -> None:
        g = self.granules[use.index]
        join, hooks = self.quiet(use), self.hook_calls(use)
        first_of_block = g.block is not None and (use.index == 0 or self.granules[use.index - 1].block != g.block)
        deps = self.before_use(use)
        layer = g.block
        last_of_block = g.block is not None and (use.index == len(self.granules) - 1
                                                 or self.granules[use.index + 1].block != g.block)
        head = g.block is None and g.role not in EMBEDDINGS and use.index == len(self.granules) - 1
        op: OpRef
        if use.what is F:
            alloc: tuple[Alloc, ...] = ()
            if first_of_block and self.starts_segment(g.block):
                self.partition_checkpoint(use)
            if first_of_block and self.starts_segment(g.block) and self.t.cpu_checkpointing:
                self.copy(Stream.D2H, self.checkpoint_bytes, f"checkpoint of block {g.block} to the host", Phase.FWD,
                          use.micro_step, stream=Stream.COMPUTE, layer=layer, pageable=True, fresh=True)
            if first_of_block:
                alloc = (Alloc(Mem.ACTIVATIONS, f"activations block {g.block}", self.kept_bytes(g.block)),)
            elif head:
                alloc = (Alloc(Mem.ACTIVATIONS, "activations head", self.head_activation_bytes()),)
            op = self.compute(f"fwd {g.name}", Phase.FWD, use.micro_step, g.passes.forward, layer, deps,
                              alloc=alloc, join=join, hooks=hooks)
            if last_of_block or g.role is Role.TOKEN_EMBEDDING:   # the vocab-parallel embedding
                op = self.tensor_parallel(use, 2 if last_of_block else 1) or op
        elif use.what is R:
            alloc = ()
            if first_of_block and self.starts_segment(g.block):
                self.restore_checkpoint(use)
            if first_of_block:
                full = self.block_activation_bytes(act.Recompute.NONE)
                alloc = (Alloc(Mem.ACTIVATIONS, f"recomputed block {g.block}", full),)
            op = self.compute(f"recompute {g.name}", Phase.BWD, use.micro_step, g.passes.forward, layer, deps,
                              alloc=alloc, join=join, hooks=hooks)
            if last_of_block:
                op = self.tensor_parallel(use, 2) or op
        else:
            extra = g.selective if self.t.recompute is act.Recompute.SELECTIVE else ()
            if self.t.recompute is act.Recompute.SELECTIVE_OP and last_of_block:
                self.compute(f"recompute (per-op) block {g.block}", Phase.BWD, use.micro_step,
                             self.block_op_recompute(g.block), layer, deps,
                             alloc=(Alloc(Mem.ACTIVATIONS, f"recomputed block {g.block}", self.op_working_bytes),))
            transient = (Alloc(Mem.ACTIVATIONS, "loss backward", self.loss_transient_bytes()),) if head else ()
            self.compute(f"bwd-input {g.name}", Phase.BWD, use.micro_step, extra + g.passes.backward_input, layer,
                         deps, join=join, hooks=hooks, alloc=transient, free=transient)
            if first_of_block:
                self.tensor_parallel(use, 2)
            free: tuple[Alloc, ...] = ()
            if first_of_block:
                free = (Alloc(Mem.ACTIVATIONS, f"activations block {g.block}", self.kept_bytes(g.block)),)
                if self.segment_of(g.block) is not None:
                    full = self.block_activation_bytes(act.Recompute.NONE)
                    free += (Alloc(Mem.ACTIVATIONS, f"recomputed block {g.block}", full),)
                elif self.t.recompute is act.Recompute.SELECTIVE_OP:
                    free += (Alloc(Mem.ACTIVATIONS, f"recomputed block {g.block}", self.op_working_bytes),)
            elif head:
                free = (Alloc(Mem.ACTIVATIONS, "activations head", self.head_activation_bytes()),)
            op = self.compute(f"bwd-weight {g.name}", Phase.BWD, use.micro_step, g.passes.backward_weight, layer,
                              free=free, join=join)
        self.after_use(use, op)

    def tensor_parallel(self, use: Use, count: int) -> OpRef | None:
        """Megatron tensor parallelism (Shoeybi et al. 2019 Sec. 3): per block two
        all-reduces of s b h forward and two backward (one after attention, one after the
        MLP; the embedding one forward), on the compute stream, nothing overlapped. With
        sequence parallelism (Korthikanti et al. Sec. 4.2) each becomes an all-gather plus
        a reduce-scatter of the same volume. A block's all-gathers carry fp8 values under
        torchtitan's Float8 tensor parallelism (sim.engines.workload.float8_tp)."""
        if self.layout.tp == 1:
            return None
        elements = self.t.seq_len * self.t.micro_batch * self.m.hidden
        nbytes = self.elem(self.half) * elements
        gather_bytes = float(elements) if count == 2 and float8_tp(self.s) else nbytes
        phase = Phase.FWD if use.what is F else Phase.BWD
        layer = self.granules[use.index].block
        last = None
        for _ in range(count):
            if self.s.parallel.sequence_parallel:
                self.collective(Stream.COMPUTE, Coll.ALL_GATHER, gather_bytes, "TP all-gather", phase, use.micro_step,
                                axis=Axis.TP, layer=layer, purpose="tensor parallel")
                last = self.collective(Stream.COMPUTE, Coll.REDUCE_SCATTER, nbytes, "TP reduce-scatter", phase,
                                       use.micro_step, axis=Axis.TP, layer=layer, purpose="tensor parallel")
            else:
                last = self.collective(Stream.COMPUTE, Coll.ALL_REDUCE, nbytes, "TP all-reduce", phase,
                                       use.micro_step, axis=Axis.TP, layer=layer, purpose="tensor parallel")
        return last

    def head_activation_bytes(self) -> float:
        return act.outside_layers_activation_bytes(self.m, self.t.seq_len, self.t.micro_batch,
                                                   tp=self.s.parallel.tp, value_bytes=self.elem(self.half),
                                                   fused_loss=self.s.compute.cross_entropy is LossImpl.FUSED)

    def loss_transient_bytes(self) -> float:
        return act.loss_backward_transient_bytes(self.m, self.t.seq_len, self.t.micro_batch, tp=self.s.parallel.tp,
                                                 value_bytes=self.elem(self.half),
                                                 megatron=self.s.compute.kernels is KernelStyle.MEGATRON,
                                                 fused=self.s.compute.cross_entropy is LossImpl.FUSED)

    # -- hooks -----------------------------------------------------------------------------
    def resident_allocations(self, census: list[TensorGroup]) -> Resident:
        """The engine's resident memory (its module's function, which `zerosim memory` reads too)."""
        raise NotImplementedError

    def resident(self) -> None:
        """Allocations that exist before the step: the model states."""
        p = self.s.parallel
        r = self.resident_allocations(stage_census(self.m, p.tp, self.s.stages, self.stage_index))
        for a in r.device:
            self.b.resident(a.category, a.label, a.nbytes)
        self.b.host_allocs.extend(r.host)

    def before_use(self, use: Use) -> list[OpRef | None]:
        return []

    def hook_calls(self, use: Use) -> int:
        """Framework hook calls the host makes around this use (their CPU time: the cluster's
        `[host]` hook cost, sim.des.host). The base planner's engines hook nothing per module."""
        return 0

    def quiet(self, use: Use) -> bool:
        """True when no hook acts on `use` (before_use and after_use do nothing for it), so
        its kernels may join the compute op before them (Builder.compute `join`): one op per
        run of modules instead of one per module, the same times. The base planner says
        False; tests/crosscheck/test_joined_kernels.py checks the planners that say True."""
        return False

    def after_use(self, use: Use, op: OpRef) -> None:
        """Called with the id of the use's last compute op."""

    def end_of_backward(self, ms: int) -> None:
        """After the last backward op of micro-step `ms`."""

    def start_of_step(self) -> None:
        """Before the first micro-step: work that runs beside the whole step."""

    def optimizer_step(self) -> None:
        """At the accumulation boundary."""

    def notes(self) -> list[str]:
        return []

    def lora_notes(self) -> list[str]:
        """What LoRA changes, for the report (sim.core.model.LoraSpec)."""
        lora = self.m.lora
        if lora is None:
            return []
        return [f"LoRA r {lora.rank} on {', '.join(lora.targets)}: {self.grad_psi:,} trainable parameters of "
                f"{self.psi:,} ({100 * self.grad_psi / self.psi:.2f}%); the frozen base computes no weight "
                "gradients and has no gradient traffic or optimizer state; frozen Linears keep no input for a "
                "weight gradient (sim.analytic.activations.lora_saved_change)"]

    # -- shared pieces ---------------------------------------------------------------------
    def optimizer(self, placement: OptimizerPlacement, params: float, deps: Iterable[OpRef | None] = ()) -> OpRef:
        """The optimizer step over `params` parameters, where `placement` puts it."""
        return placement.step(self.b, self.boundary, params, deps)

    def copy(self, direction: Stream, nbytes: float, name: str, phase: Phase, ms: int, *,
             stream: Stream | None = None, deps: Iterable[OpRef | None] = (), layer: int | None = None,
             pageable: bool = False, fresh: bool = False) -> OpRef:
        """A PCIe copy, on its own copy stream unless the engine issues it on another."""
        return self.b.copy(direction, nbytes, name, phase, ms, stream=stream, deps=deps, layer=layer,
                           pageable=pageable, fresh=fresh)

    def grad_norm(self, always: bool = False, nbytes: float = 4.0) -> OpRef | None:
        """Global gradient norm: one tiny all-reduce (reference 1.1), when clipping, or
        always where the engine computes it anyway (DeepSpeed ZeRO-1/2/3's step)."""
        if self.t.gradient_clipping <= 0 and not always:
            return None
        return self.collective(Stream.COMPUTE, Coll.ALL_REDUCE, nbytes, "grad-norm all-reduce", Phase.STEP,
                               self.boundary, purpose="grad norm")
