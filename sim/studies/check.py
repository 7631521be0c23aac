"""DES vs the analytic twin, side by side (`zerosim check`): bytes per collective kind,
step time against its bounds, peak memory against the model states.

Bounds: with every op's cost taken in isolation (sim.analytic.opcost), the step can be no
shorter than the busiest stream's work and no longer than all the work done one op at a
time (the serial schedule, which the DES reproduces exactly when asked to serialise).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from sim.analytic import opcost
from sim.analytic.lora import lora_states
from sim.analytic.memory import model_state_bytes
from sim.analytic.placement import rank_tensors
from sim.analytic.volumes import (
    add,
    pipeline_volume,
    tensor_parallel_volume,
)
from sim.core.enums import ScheduleMode, ZeroStage
from sim.core.units import BYTES_PER_ELEMENT
from sim.des.engine import local_time
from sim.des.host import host_cost
from sim.engines.layout import Layout
from sim.engines.plan import expected_dp_volume
from sim.engines.policies import pipe_partitioned
from sim.engines.schedule import AnyOp, Collective, Copy, Send
from sim.inputs.scenario import Scenario
from sim.results.step import SimulationResult


def expected_volume(s: Scenario) -> dict[str, float]:
    """The analytic twin's bytes per rank per step by collective kind, on pipeline stage 0."""
    p, t = s.parallel, s.training
    shape = dict(seq_len=t.seq_len, micro_batch=t.micro_batch, hidden=s.model.hidden, grad_accum=t.grad_accum)
    blocks = s.stages.counts()[0]
    plan = t.recompute_plan
    tp = tensor_parallel_volume(blocks, True, p.tp, elem=BYTES_PER_ELEMENT[t.precision.value],
                                sequence_parallel=p.sequence_parallel,
                                recomputed=plan.recomputed(blocks) if plan else 0,
                                checkpoint_gathers=len(plan.segments(blocks)) if plan and s.partitioned_checkpoints else 0, **shape)
    pipe = pipeline_volume(0, p.pp, tp=p.tp, sequence_parallel=p.sequence_parallel,
                           virtual_stages=p.virtual_stages, partitioned=pipe_partitioned(s),
                           elem=BYTES_PER_ELEMENT[t.precision.value], **shape)
    return add(expected_dp_volume(s), tp, pipe)


def op_cost(op: AnyOp, s: Scenario, layout: Layout) -> float:
    """Closed-form duration of one op with nothing else running."""
    cluster = s.cluster
    alone = local_time(op, s)
    if alone is not None:
        return alone
    if isinstance(op, Copy):
        return opcost.copy_time(op.nbytes, op.direction.value, op.pageable, cluster, s.gpus_per_node,
                                s.zero.aio if s.zero else None, op.fresh)
    assert isinstance(op, Collective | Send), op
    members = layout.group(op.axis, layout.representatives[0])
    nodes, per_node = layout.group_span(op.axis, layout.representatives[0])
    phases = opcost.collective_phases(op.coll, op.nbytes, opcost.GroupShape(len(members), nodes, per_node),
                                      cluster, s.comm.algorithm)
    return opcost.isolated_time(phases, cluster, s.comm.override(op.axis))


@dataclass(frozen=True)
class Bounds:
    busiest_stream_s: float   # lower bound
    serial_s: float           # upper bound
    by_stream: dict[str, float]


def step_bounds(result: SimulationResult) -> Bounds:
    """Lower bound: the busiest stream of any rank class, the host that issues them counted
    as one (sim.des.host); upper bound: every op of every class one after another, and the
    host's work too (with pipeline stages, the stages' work in sequence)."""
    per_stream: dict[tuple[int, str], float] = defaultdict(float)
    s = result.scenario
    for cls in range(len(result.schedule.classes)):
        for op in result.schedule.ops(cls):
            per_stream[(cls, op.stream.value)] += op_cost(op, s, result.layout)
            per_stream[(cls, "host")] += host_cost(op, s.cluster.host, s.engine)
    first = {stream: v for (cls, stream), v in per_stream.items() if cls == 0}
    return Bounds(max(per_stream.values()), sum(per_stream.values()), first)


def check_rows(result: SimulationResult) -> list[tuple[str, float, float, str]]:
    """(quantity, DES, analytic, relation) rows for one simulated scenario."""
    from sim.simulate import volume_by_kind
    s = result.scenario
    rows = []
    des = volume_by_kind(result)
    exp = expected_volume(s)
    for kind in sorted(set(des) | set(exp)):
        rows.append((f"bytes/rank {kind}", des.get(kind, 0.0), exp.get(kind, 0.0), _relation(s, kind)))
    b = step_bounds(result)
    rows.append(("step time >= busiest stream (s)", result.step_time_s, b.busiest_stream_s, ">="))
    rows.append(("step time <= serial sum (s)", result.step_time_s, b.serial_s, "<="))
    stage = ZeroStage(int(s.zero_stage))
    p = s.parallel
    psi = max(sum(n for n, _ in rank_tensors(s.model, p.tp, s.stages, k)) for k in range(p.pp))
    states = (lora_states(s.model, p.dp, stage) if s.model.lora else model_state_bytes(psi, p.dp, stage)).total
    rows.append(("peak memory >= model states, paper (GB)", result.peak_pool().peak / 1e9, states / 1e9, ">="))
    return rows


def _relation(s: Scenario, kind: str) -> str:
    """ZeRO-3 keeps a module gathered when it reappears within max_reuse_distance, or when
    prefetch passed over its next use (partitioned_param_coordinator.py): unless both are
    off, the closed form (every module gathered for every use) is an upper bound."""
    z = s.zero
    keeps = (z is not None and z.stage == ZeroStage.PARAMETERS
             and (z.max_reuse_distance > 0 or z.prefetch_bucket_size > 0))
    return "<=" if keeps and kind == "all_gather" and s.schedule_mode is ScheduleMode.IMPLEMENTED else "=="


def holds(des: float, analytic: float, relation: str, rel: float = 1e-9) -> bool:
    tol = rel * max(abs(des), abs(analytic), 1e-30)
    if relation == "==":
        return abs(des - analytic) <= tol
    if relation == ">=":
        return des >= analytic - tol
    return des <= analytic + tol
