"""Functional ZeRO: K virtual ranks train an MLP numerically, driven by the planner's
paper-mode schedule (the lecture's zero.py idea, reference/000 Sec. 2.5).

The planner (sim.engines.paper) decides which collective happens when; this executor
walks the schedule's ops in issue order and performs them on K numpy ranks: forward and
backward of each layer on each rank's slice of the batch, broadcasts / reduces /
reduce-scatters / all-gathers / all-reduces of float32 segments with a fixed-order sum
(rank 0 first), and Adam on what each rank owns. Because every element is summed in the
same order and updated by the same formula, DP, ZeRO-1, ZeRO-2 and ZeRO-3 train to
bitwise-identical parameters; what differs is what each rank stores, which is logged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sim.analytic.kernels import Passes
from sim.core.enums import Coll
from sim.engines.layout import Layout
from sim.engines.paper import PaperPlanner
from sim.engines.schedule import AnyOp, Collective, Compute, GpuOptimizer, Schedule
from sim.engines.workload import Unit
from sim.inputs.load import scenario_from_table

F32 = np.float32
LR, BETA1, BETA2, EPS = F32(1e-3), F32(0.9), F32(0.999), F32(1e-8)


@dataclass(frozen=True)
class Mlp:
    """Layer widths; layer i maps widths[i] -> widths[i+1] (weight + bias), ReLU between."""

    widths: tuple[int, ...]

    @property
    def layer_sizes(self) -> list[int]:
        return [a * b + b for a, b in zip(self.widths, self.widths[1:])]

    @property
    def params(self) -> int:
        return sum(self.layer_sizes)


LECTURE_MLP = Mlp((32,) + (64,) * 13 + (8,))   # 14 layers, 52,552 parameters, largest 4,160


def paper_schedule(mlp: Mlp, ranks: int, stage: int, steps_of_accumulation: int = 1) -> Schedule:
    """The planner's paper-mode schedule for this MLP on `ranks` data-parallel ranks."""
    table = {"model": {"layers": 1, "hidden": 8, "heads": 1, "kv_heads": 1, "ffn_hidden": 8, "vocab": 8},
             "cluster": "local-cpu", "nodes": 1, "gpus_per_node": ranks, "schedule": "paper",
             "training": {"seq_len": 1, "micro_batch": 1, "grad_accum": steps_of_accumulation,
                          "precision": "fp32"},
             "zero": {"stage": stage}}
    s = scenario_from_table(table, Path("sim/validate/functional.py"), f"mlp-zero{stage}")
    units = [Unit(f"layer{i}", None, (n,), Passes()) for i, n in enumerate(mlp.layer_sizes)]
    return PaperPlanner(s, Layout(tp=1, pp=1, dp=ranks, gpus_per_node=ranks), granules=units).build()


@dataclass
class Rank:
    """What one virtual rank holds (None where it holds nothing)."""

    params: np.ndarray | None = None     # full flat vector, or None (ZeRO-3 keeps only its segment)
    segment: np.ndarray | None = None    # own parameter segment (ZeRO-3)
    fetched: dict[int, np.ndarray] = field(default_factory=dict)   # broadcast segments (ZeRO-3)
    grads: np.ndarray | None = None      # full gradient (DP, ZeRO-1)
    grad_parts: dict[int, np.ndarray] = field(default_factory=dict)   # per-segment gradients (ZeRO-2/3)
    m: np.ndarray | None = None
    v: np.ndarray | None = None
    acts: list[np.ndarray] = field(default_factory=list)
    delta: np.ndarray | None = None      # gradient flowing backward
    delta_out: np.ndarray | None = None  # the gradient at the current layer's output
    target: np.ndarray | None = None     # this rank's regression targets

    def stored(self) -> int:
        arrays = [self.params, self.segment, self.grads, self.m, self.v,
                  *self.fetched.values(), *self.grad_parts.values()]
        return sum(a.size for a in arrays if a is not None)


def held(array: np.ndarray | None) -> np.ndarray:
    """An array the schedule says a rank holds at this point (its absence is a bug)."""
    assert array is not None
    return array


@dataclass
class Run:
    mlp: Mlp
    ranks: int
    stage: int
    schedule: Schedule
    state: list[Rank]
    log: list[dict[str, object]] = field(default_factory=list)
    peak_stored: list[int] = field(default_factory=list)
    step: int = 1

    @property
    def seg(self) -> int:
        return self.mlp.params // self.ranks

    def bounds(self, k: int) -> slice:
        return slice(k * self.seg, (k + 1) * self.seg if k < self.ranks - 1 else self.mlp.params)

    def offsets(self) -> list[int]:
        return list(np.cumsum([0] + self.mlp.layer_sizes))


def train(mlp: Mlp, ranks: int, stage: int, steps: int = 10, batch_per_rank: int = 8, seed: int = 0) -> Run:
    """Train `steps` Adam steps of `mlp` on `ranks` virtual ranks under ZeRO `stage`."""
    rng = np.random.default_rng(seed)
    init = (rng.standard_normal(mlp.params) * 0.1).astype(F32)
    run = Run(mlp, ranks, stage, paper_schedule(mlp, ranks, stage), [Rank() for _ in range(ranks)])
    for r, rank in enumerate(run.state):
        own = init[run.bounds(r)].copy()
        if stage == 3:
            rank.segment = own
        else:
            rank.params = init.copy()
        size = mlp.params if stage == 0 else own.size
        rank.m, rank.v = np.zeros(size, F32), np.zeros(size, F32)
    data = np.random.default_rng(seed + 1)
    ops = sorted(run.schedule.ops(0), key=lambda o: o.id)
    for run.step in range(1, steps + 1):
        x = data.standard_normal((ranks * batch_per_rank, mlp.widths[0])).astype(F32)
        y = data.standard_normal((ranks * batch_per_rank, mlp.widths[-1])).astype(F32)
        for r, rank in enumerate(run.state):
            rank.acts = [x[r * batch_per_rank:(r + 1) * batch_per_rank]]
            rank.target = y[r * batch_per_rank:(r + 1) * batch_per_rank]
            rank.grads = np.zeros(mlp.params, F32) if stage < 2 else None
        for op in ops:
            _execute(run, op)
            run.peak_stored.append(max(rank.stored() for rank in run.state))
    return run


def parameters(run: Run) -> np.ndarray:
    """The trained flat parameter vector (rank 0's, or the segments put together)."""
    if run.stage == 3:
        return np.concatenate([rank.segment for rank in run.state if rank.segment is not None])
    return held(run.state[0].params).copy()


def _execute(run: Run, op: AnyOp) -> None:
    if isinstance(op, Compute):
        for name in op.module_ops():
            found = re.search(r"layer(\d+)", name)
            layer = int(found.group(1)) if found else None
            if layer is not None:
                step = {"fwd": _forward, "bwd-input": _backward_input, "bwd-weight": _backward_weight}
                step[name.split()[0]](run, layer)
        for alloc in op.free:   # ZeRO-3 drops a broadcast segment after its last use
            if alloc.label.startswith("segment "):
                for rank in run.state:
                    rank.fetched.pop(int(alloc.label.split()[1]), None)
    elif isinstance(op, GpuOptimizer):
        _adam(run)
    elif isinstance(op, Collective):
        _collective(run, op)


def _layer(run: Run, rank: Rank, r: int, i: int) -> tuple[np.ndarray, np.ndarray]:
    a, b = run.mlp.widths[i], run.mlp.widths[i + 1]
    lo = run.offsets()[i]
    if rank.params is not None:
        flat = rank.params[lo:lo + a * b + b]
    else:
        flat = np.concatenate([_segment_view(run, rank, r, k) for k in range(run.ranks)])[lo:lo + a * b + b]
    return flat[:a * b].reshape(a, b), flat[a * b:]


def _segment_view(run: Run, rank: Rank, r: int, k: int) -> np.ndarray:
    if k == r:
        return held(rank.segment)
    if k in rank.fetched:
        return rank.fetched[k]
    return np.full(run.bounds(k).stop - run.bounds(k).start, np.nan, F32)  # not held: poison


def _forward(run: Run, i: int) -> None:
    last = len(run.mlp.layer_sizes) - 1
    for r, rank in enumerate(run.state):
        w, b = _layer(run, rank, r, i)
        out = rank.acts[-1] @ w + b
        rank.acts.append(np.maximum(out, 0) if i < last else out)
        if i == last:   # MSE loss, mean over this rank's batch: d loss / d out
            rank.delta = (F32(2) * (out - held(rank.target)) / F32(out.size)).astype(F32)


def _backward_input(run: Run, i: int) -> None:
    for r, rank in enumerate(run.state):
        w, _ = _layer(run, rank, r, i)
        rank.delta_out = held(rank.delta)
        if i > 0:
            rank.delta = (rank.delta_out @ w.T) * (rank.acts[i] > 0)


def _backward_weight(run: Run, i: int) -> None:
    lo = run.offsets()[i]
    for rank in run.state:
        delta = held(rank.delta_out)
        g = np.concatenate([(rank.acts[i].T @ delta).ravel(), delta.sum(axis=0)]).astype(F32)
        if rank.grads is not None:
            rank.grads[lo:lo + g.size] += g
            continue
        for k in range(run.ranks):   # ZeRO-2/3: gradients kept per segment until reduced
            s = run.bounds(k)
            a, b = max(lo, s.start), min(lo + g.size, s.stop)
            if a < b:
                part = rank.grad_parts.setdefault(k, np.zeros(s.stop - s.start, F32))
                part[a - s.start:b - s.start] += g[a - lo:b - lo]


def _sum(arrays: list[np.ndarray], ranks: int) -> np.ndarray:
    """Fixed-order sum (rank 0 first), then the average."""
    total = arrays[0].copy()
    for a in arrays[1:]:
        total += a
    return total / F32(ranks)


def _collective(run: Run, op: Collective) -> None:
    k_match = re.search(r"segment (\d+)", op.name)
    k = int(k_match.group(1)) if k_match else None
    K, state = run.ranks, run.state
    if op.coll is Coll.ALL_REDUCE:
        mean = _sum([held(s.grads) for s in state], K)
        for s in state:
            s.grads = mean.copy()
    elif op.coll is Coll.REDUCE_SCATTER:
        mean = _sum([held(s.grads) for s in state], K)
        for r, s in enumerate(state):
            s.grad_parts = {r: mean[run.bounds(r)].copy()}
            s.grads = None
    elif op.coll is Coll.REDUCE:
        assert k is not None
        mean = _sum([s.grad_parts[k] for s in state], K)
        for r, s in enumerate(state):
            if r == k:
                s.grad_parts[k] = mean
            else:
                s.grad_parts.pop(k)
    elif op.coll is Coll.BROADCAST:
        assert k is not None
        for r, s in enumerate(state):
            if r != k:
                s.fetched[k] = held(state[k].segment).copy()
    elif op.coll is Coll.ALL_GATHER:
        full = np.concatenate([held(state[r].params)[run.bounds(r)] for r in range(K)])
        for s in state:
            s.params = full.copy()
    run.log.append({"step": run.step, "op": op.coll.value if op.coll else "", "name": op.name,
                    "elements": op.nbytes / 4, "stored": [s.stored() for s in state]})


def _adam(run: Run) -> None:
    t = run.step
    for r, s in enumerate(run.state):
        if run.stage == 0:
            grad, target = s.grads, s.params
        elif run.stage == 3:
            grad, target = s.grad_parts[r], s.segment
        else:
            grad, target = (s.grad_parts[r], held(s.params)[run.bounds(r)])
        assert grad is not None and target is not None and s.m is not None and s.v is not None
        s.m[:] = BETA1 * s.m + (F32(1) - BETA1) * grad
        s.v[:] = BETA2 * s.v + (F32(1) - BETA2) * grad * grad
        m_hat = s.m / (F32(1) - BETA1 ** F32(t))
        v_hat = s.v / (F32(1) - BETA2 ** F32(t))
        target -= LR * m_hat / (np.sqrt(v_hat) + EPS)
        if run.stage in (1, 2):
            s.grad_parts = {}
        if run.stage == 3:
            s.grad_parts = {}
