"""What a pipeline stage's planner keeps of its activations and how it checkpoints them: the
bytes a block keeps from forward to backward, the recompute segments of full recomputation
(per model chunk), and DeepSpeed's checkpoint handling (partitioned over TP, copied into
contiguous buffers, kept on the host), as ops on the compute stream (a mixin of
sim.engines.skeleton.Planner; sizes from sim.analytic.activations, shared with the twin)."""

from __future__ import annotations

from collections.abc import Iterable
from functools import cached_property

from sim.analytic import activations as act
from sim.analytic import kernels as kn
from sim.core.enums import AttentionImpl, Axis, Coll
from sim.core.model import ModelSpec
from sim.engines.layout import Layout
from sim.engines.schedule import Alloc, Mem, OpRef, Phase, Stream
from sim.engines.uses import Use
from sim.engines.workload import Unit
from sim.inputs.scenario import Scenario, Training


class Checkpointing:
    """Activation and checkpoint planning of a stage (see the module docstring). The
    planner (sim.engines.skeleton.Planner) provides the state and the op helpers below."""

    s: Scenario
    t: Training
    m: ModelSpec
    layout: Layout
    granules: list[Unit]
    stage_index: int
    v: int
    per_chunk: int
    _activation_bytes: dict[act.Recompute, float]

    def elem(self, dtype: str) -> int:
        raise NotImplementedError

    def chunk_start(self, chunk: int) -> int:
        raise NotImplementedError

    @property
    def half(self) -> str:
        raise NotImplementedError

    # the planner's op helpers (sim.engines.skeleton.Planner defines them)
    def compute(self, name: str, phase: Phase, ms: int, kernels: tuple[kn.Kernel, ...], layer: int | None,
                deps: Iterable[OpRef | None] = (), *, alloc: tuple[Alloc, ...] = (),
                free: tuple[Alloc, ...] = (), join: bool = False, hooks: int = 0, pieces: int = 0) -> OpRef:
        raise NotImplementedError

    def collective(self, stream: Stream, coll: Coll, nbytes: float, name: str, phase: Phase, ms: int, *,
                   axis: Axis = Axis.DP, deps: Iterable[OpRef | None] = (), layer: int | None = None,
                   alloc: tuple[Alloc, ...] = (), free: tuple[Alloc, ...] = (), purpose: str = "",
                   pieces: int = 0) -> OpRef:
        raise NotImplementedError

    def copy(self, direction: Stream, nbytes: float, name: str, phase: Phase, ms: int, *,
             stream: Stream | None = None, deps: Iterable[OpRef | None] = (), layer: int | None = None,
             pageable: bool = False, fresh: bool = False) -> OpRef:
        raise NotImplementedError

    def block_activation_bytes(self, recompute: act.Recompute | None = None) -> float:
        rc = self.t.recompute if recompute is None else recompute
        if rc not in self._activation_bytes:
            self._activation_bytes[rc] = self._block_activation_bytes(rc)
        return self._activation_bytes[rc]

    def _block_activation_bytes(self, rc: act.Recompute) -> float:
        if rc is act.Recompute.FULL:     # the checkpoint, unless it lives on the host
            return 0.0 if self.t.cpu_checkpointing else self.checkpoint_bytes
        p = self.s.parallel
        return act.layer_activation_bytes(self.m, self.t.seq_len, self.t.micro_batch, tp=p.tp,
                                          sequence_parallel=p.sequence_parallel, recompute=rc,
                                          value_bytes=self.elem(self.half),
                                          flash=self.s.compute.attention is AttentionImpl.FLASH)

    @cached_property
    def _segments(self) -> dict[int, range]:
        """Model block -> the recompute segment (model blocks) that holds it."""
        plan = self.t.recompute_plan
        if plan is None:
            return {}
        out = {}
        for chunk in range(self.v):   # recomputation is planned per model chunk (each its own block list)
            first = self.chunk_start(chunk)
            for local in plan.segments(self.per_chunk):
                segment = range(first + local.start, first + local.stop)
                out.update({b: segment for b in segment})
        return out

    def segment_of(self, block: int | None) -> range | None:
        """The recompute segment of model block `block` (None: not recomputed)."""
        return None if block is None else self._segments.get(block)

    def kept_bytes(self, block: int | None) -> float:
        """Activations block `block` keeps from its forward to its backward: its checkpoint
        when it starts a recompute segment, nothing inside one, everything outside them
        (and the recompute setting's own figure without full recomputation)."""
        if self.t.recompute_plan is None:
            return self.block_activation_bytes()
        segment = self.segment_of(block)
        if segment is None:
            return self.block_activation_bytes(act.Recompute.NONE)
        return self.block_activation_bytes(act.Recompute.FULL) if block == segment[0] else 0.0

    @cached_property
    def op_working_bytes(self) -> float:
        """Per-op selective checkpointing: what a block's recomputation adds to the saved
        activations while its backward runs (sim.analytic.op_sac)."""
        return max(0.0, self.block_activation_bytes(act.Recompute.NONE) - self.block_activation_bytes())

    def block_op_recompute(self, block: int | None) -> tuple[kn.Kernel, ...]:
        """The forward kernels per-op selective checkpointing runs again for `block`, all
        at once when its backward begins (every granule of the block)."""
        return tuple(k for g in self.granules if g.block == block for k in g.op_recompute)

    def starts_segment(self, block: int | None) -> bool:
        segment = self.segment_of(block)
        return segment is not None and block == segment[0]

    @cached_property
    def checkpoint_bytes(self) -> float:
        """What a rank stores of one checkpoint: the block input (1/t of it with sequence
        parallelism, or with DeepSpeed's partitioned activations)."""
        p = self.s.parallel
        full = act.layer_activation_bytes(self.m, self.t.seq_len, self.t.micro_batch, tp=p.tp,
                                          sequence_parallel=p.sequence_parallel, recompute=act.Recompute.FULL,
                                          value_bytes=self.elem(self.half))
        return full / p.tp if self.s.partitioned_checkpoints else full

    def partition_checkpoint(self, use: Use) -> None:
        """DeepSpeed's `partition_activations` (checkpointing.py `partition_activations`): the
        block input's slice for this rank is cloned; with `contiguous_memory_optimization`
        it is copied again into a preallocated buffer, one of `number_checkpoints` that the
        micro-step's first checkpoint allocates and its first backward lets go (the unused
        ones then; each used one when its block is recomputed). On the host with
        `cpu_checkpointing`: that copy is the D2H, and the buffers take no GPU memory."""
        if not self.t.partition_activations:
            return
        block, cb = self.granules[use.index].block, self.checkpoint_bytes
        kernels: tuple[kn.Kernel, ...] = (kn.memory(f"clone checkpoint partition of block {block}", 2 * cb),)
        contiguous = self.t.contiguous_checkpoints and not self.t.cpu_checkpointing
        if contiguous:
            kernels += (kn.memory(f"copy checkpoint of block {block} into the contiguous buffer", 2 * cb),)
        alloc: tuple[Alloc, ...] = ()
        if contiguous and block == min(self._segments) and self.unused_contiguous_bytes:
            alloc = (Alloc(Mem.ACTIVATIONS, "unused contiguous checkpoint buffers", self.unused_contiguous_bytes),)
        self.compute(f"partition checkpoint of block {block}", Phase.FWD, use.micro_step, kernels, block, alloc=alloc)

    @cached_property
    def unused_contiguous_bytes(self) -> float:
        """The contiguous checkpoint buffers no checkpoint of this stage fills."""
        segments = len({seg.start for seg in self._segments.values()})
        return max(0, self.t.contiguous_checkpoints - segments) * self.checkpoint_bytes

    def restore_checkpoint(self, use: Use) -> None:
        """Before a segment is recomputed (deepspeed/runtime/activation_checkpointing/
        checkpointing.py `CheckpointFunction.backward`): the checkpoint comes back from the
        host (`cpu_checkpointing`, a blocking H2D copy from the pageable tensor `.to("cpu")` made) and its partitions are all-gathered
        over the TP group (`partition_activations`), both on the compute stream."""
        block = self.granules[use.index].block
        if self.t.contiguous_checkpoints and not self.t.cpu_checkpointing and self.unused_contiguous_bytes \
                and block == max(seg.start for seg in self._segments.values()):   # the first recomputed
            self.compute(f"release unused contiguous buffers ({block})", Phase.BWD, use.micro_step, (), block,
                         free=(Alloc(Mem.ACTIVATIONS, "unused contiguous checkpoint buffers",
                                     self.unused_contiguous_bytes),))
        if self.t.cpu_checkpointing:
            self.copy(Stream.H2D, self.checkpoint_bytes, f"checkpoint of block {block} from the host", Phase.BWD,
                      use.micro_step, stream=Stream.COMPUTE, layer=block, pageable=True)
        if self.s.partitioned_checkpoints:
            self.collective(Stream.COMPUTE, Coll.ALL_GATHER, self.checkpoint_bytes * self.s.parallel.tp,
                            "all-gather partitioned checkpoint", Phase.BWD, use.micro_step, axis=Axis.TP,
                            layer=block, purpose="checkpoint")

