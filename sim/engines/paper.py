"""The ZeRO paper's idealised schedules, as the lecture animates them (reference/000
Secs. 2.2-2.4, 3.1; arXiv 1910.02054 Sec. 7), to compare with the engines as implemented.

The flat parameter vector is cut into dp equal segments, segment k owned by rank k.
- Stage 0 (plain DP): one all-reduce of all gradients after the last backward.
- ZeRO-1: one reduce-scatter of all gradients after the last backward; Adam on the own
  segment; one all-gather of the updated parameters.
- ZeRO-2: as backward passes a segment's first element, its gradients are reduced to its
  owner (a reduce per segment, every micro-step); Adam; all-gather after the step.
- ZeRO-3: before a segment is first used (forward, then again in backward) its owner
  broadcasts it, one segment ahead; after backward of a segment, a reduce to its owner.
Volumes per rank: 2 Psi (stages 0-2) and 3 Psi (stage 3), times (N-1)/N.
"""

from __future__ import annotations

from sim.analytic.placement import TensorGroup, census_numel
from sim.analytic.volumes import paper_volume
from sim.core.enums import Coll, OptimizerImpl, ScheduleMode, ZeroStage
from sim.core.errors import InputError
from sim.core.units import BYTES_PER_ELEMENT
from sim.engines.layout import Layout
from sim.engines.model import EngineModel
from sim.engines.policies import GpuAdam
from sim.engines.resident import Resident, half_bytes, resident
from sim.engines.schedule import Alloc, Mem, OpRef, Phase, Stream
from sim.engines.skeleton import Planner
from sim.engines.uses import B, F, R, Use
from sim.engines.workload import Unit
from sim.inputs.scenario import Scenario
from sim.inputs.schema import NOT_SIMULATED_YET


class PaperPlanner(Planner):
    name = "paper"

    def __init__(self, s: Scenario, layout: Layout, stage: int = 0, granules: list[Unit] | None = None) -> None:
        super().__init__(s, layout, stage, granules)
        self.stage = self.s.zero_stage
        self.h = self.elem(self.half)
        self.seg = self.psi / self.dp
        starts: list[int] = []
        acc = 0
        for g in self.granules:
            starts.append(acc)
            acc += g.numel
        self.span = [(a, a + g.numel) for a, g in zip(starts, self.granules)]
        self.bcast: dict[tuple[int, Phase, int], OpRef] = {}
        self.reduced: set[tuple[int, int]] = set()
        self.last_comm: OpRef | None = None

    def resident_allocations(self, census: list[TensorGroup]) -> Resident:
        return paper_resident(self.s, census)

    def segments_of(self, index: int) -> list[int]:
        a, b = self.span[index]
        if b == a:
            return []
        return list(range(int(a // self.seg), int(min(self.dp - 1, (b - 1) // self.seg)) + 1))

    # -- ZeRO-3 broadcasts --------------------------------------------------------------------
    def before_use(self, use: Use) -> list[OpRef | None]:
        if self.stage < ZeroStage.PARAMETERS:
            return []
        phase = Phase.FWD if use.what is F else Phase.BWD
        segs = self.segments_of(use.index)
        deps: list[OpRef | None] = [self._broadcast(use.micro_step, phase, k) for k in segs]
        nxt = (max(segs) + 1 if phase is Phase.FWD else min(segs) - 1) if segs else None
        if nxt is not None and 0 <= nxt < self.dp:
            self._broadcast(use.micro_step, phase, nxt)   # one segment ahead
        return deps

    def _broadcast(self, ms: int, phase: Phase, k: int) -> OpRef:
        """Issued when the compute before the granule that needs it is done (or earlier, ahead)."""
        key = (ms, phase, k)
        if key not in self.bcast:
            self.bcast[key] = self.collective(
                Stream.ALLGATHER, Coll.BROADCAST, self.h * self.seg, f"broadcast segment {k} from rank {k}",
                phase, ms, deps=[self.b.last(Stream.COMPUTE)],
                alloc=(Alloc(Mem.PARAMS, f"segment {k}", self.h * self.seg),), purpose="fetch")
        return self.bcast[key]

    # -- gradient reduction -------------------------------------------------------------------
    def after_use(self, use: Use, op: OpRef) -> None:
        if self.stage >= ZeroStage.PARAMETERS:
            self._release(use, op)
        if use.what is not B or self.stage < ZeroStage.GRADIENTS:
            return
        a, _ = self.span[use.index]
        for k in self.segments_of(use.index):
            if k * self.seg >= a and (use.micro_step, k) not in self.reduced:   # segment complete
                self.reduced.add((use.micro_step, k))
                self.last_comm = self.collective(Stream.REDUCE, Coll.REDUCE, self.h * self.seg,
                                                 f"reduce segment {k} to rank {k}", Phase.BWD, use.micro_step,
                                                 deps=[op], layer=self.granules[use.index].block, purpose="grad")

    def _release(self, use: Use, op: OpRef) -> None:
        """Drop a segment after its last granule in this pass."""
        phase = Phase.FWD if use.what is F else Phase.BWD
        step = 1 if phase is Phase.FWD else -1
        nxt = use.index + step
        later = set(self.segments_of(nxt)) if 0 <= nxt < len(self.granules) else set()
        if use.what is R:
            return
        for k in self.segments_of(use.index):
            if k not in later and (use.micro_step, phase, k) in self.bcast:
                self.b.attach(op, free=(Alloc(Mem.PARAMS, f"segment {k}", self.h * self.seg),))

    def end_of_backward(self, ms: int) -> None:
        last = self.b.last(Stream.COMPUTE)
        if ms == self.boundary and self.stage == ZeroStage.NONE:
            self.last_comm = self.collective(Stream.REDUCE, Coll.ALL_REDUCE, self.h * self.psi,
                                             "all-reduce gradients", Phase.BWD, ms, deps=[last], purpose="grad")
        if ms == self.boundary and self.stage == ZeroStage.OPTIMIZER:
            self.last_comm = self.collective(Stream.REDUCE, Coll.REDUCE_SCATTER, self.h * self.psi,
                                             "reduce-scatter gradients", Phase.BWD, ms, deps=[last], purpose="grad")
        self.wait_before_next_compute(self.last_comm)

    def optimizer_step(self) -> None:
        # idealised: no gradient clipping all-reduce
        self.optimizer(GpuAdam(OptimizerImpl.FUSED), self.psi / (self.dp if self.stage >= ZeroStage.OPTIMIZER else 1))
        if self.stage in (ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS):
            self.collective(Stream.COMPUTE, Coll.ALL_GATHER, self.h * self.psi, "all-gather parameters",
                            Phase.STEP, self.boundary, purpose="post-step")

    def notes(self) -> list[str]:
        return [f"paper schedule, stage {int(self.stage)}: {self.dp} segments of {self.seg:,.0f} parameters"]


def paper_resident(s: Scenario, census: list[TensorGroup]) -> Resident:
    """(2 + 2 + 12) B per parameter, each term / dp once the stage shards it."""
    psi, h, stage = census_numel(census), half_bytes(s), s.zero_stage
    n = {z: s.parallel.dp if stage >= z else 1 for z in ZeroStage}
    return resident(s, [Alloc(Mem.PARAMS, "16-bit parameters", h * psi / n[ZeroStage.PARAMETERS]),
                        Alloc(Mem.GRADS, "16-bit gradients", h * psi / n[ZeroStage.GRADIENTS]),
                        Alloc(Mem.OPTIMIZER, "fp32 parameters, Adam m and v", 12.0 * psi / n[ZeroStage.OPTIMIZER])],
                    [])


def paper_dp_volume(s: Scenario) -> dict[str, float]:
    """The ZeRO paper's volumes (Sec. 7): 2 Psi at stages 0-2, 3 Psi at stage 3, per step."""
    t = s.training
    return paper_volume(s.model, s.parallel.dp, int(s.zero_stage), grad_accum=t.grad_accum,
                        elem=BYTES_PER_ELEMENT[t.precision.value])


def idealised_only(s: Scenario) -> None:
    """The paper schedules are one data-parallel group keeping every state on the GPU."""
    where = s.path or "scenario"
    for axis in ("tp", "pp"):
        if getattr(s.parallel, axis) > 1:
            raise InputError(where, f"parallel.{axis}", f"{axis} > 1 with the paper schedules: {NOT_SIMULATED_YET} "
                             "(2D/3D layouts are simulated with DeepSpeed and DDP); allowed: 1")
    if s.zero is not None:
        for key in ("offload_optimizer", "offload_param"):
            if getattr(s.zero, key).enabled:
                raise InputError(where, f"zero.{key}", f"offload with schedule = \"paper\": {NOT_SIMULATED_YET} "
                                 "(the paper schedules keep every state on the GPU); allowed: \"none\", or "
                                 "schedule = \"implemented\"")


PAPER = EngineModel(
    name="paper", summary="the ZeRO paper's / lecture's idealised schedules, stages 0-3",
    applies=lambda s: s.schedule_mode is ScheduleMode.PAPER,
    planner=PaperPlanner, resident=paper_resident, volume=paper_dp_volume, check=idealised_only)
