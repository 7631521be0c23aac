"""The micro-batch of a Megatron row that does not state it: the fastest that fits.

A published throughput table (Megatron's SC21 weak-scaling table, Megatron-Core's 2024
README table) gives tensor, pipeline and data parallelism and the global batch, but not
the micro-batch. Those tables are tuned runs, so the row is simulated with every
micro-batch a tuned run could have used (the powers of two that divide the sequences per
data-parallel rank, global / dp, up to `MAX_MICRO`) and predicted by the fastest one that
fits in device memory (memory grows with the micro-batch, so the first that does not fit
ends the list). The choice never looks at the published value; `zerosim fit` makes it again under
every parameter vector it tries (sim.studies.fit: a row's prediction is the fastest of its
variants), so a held-out row's micro-batch is chosen by the clock fitted without it.

Why it matters: with gradient accumulation Megatron reduces gradients only during the last
micro-batch's backward (megatron/core/pipeline_parallel/schedules.py runs the others under
`no_sync`), so at micro-batch 1 a 32B model on 48-way data parallelism has a quarter of
the backward to hide its fp32 reduce-scatter behind; at micro-batch 4 it has all of it.
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.des.engine import Mode
from sim.inputs.scenario import Scenario
from sim.simulate import simulate

MAX_MICRO = 8      # the largest micro-batch Megatron's published configurations use (BLOOM 2-4, SC21 1-8)


def candidates(global_batch: int, dp: int) -> list[int]:
    """Micro-batches a run with `global_batch` sequences over `dp` ranks can use: the powers
    of two that divide global / dp, up to MAX_MICRO."""
    per_rank = global_batch // dp
    return [m for m in (1, 2, 4, 8) if m <= min(per_rank, MAX_MICRO) and per_rank % m == 0]


def step_or_none(s: Scenario) -> tuple[float, bool] | None:
    """(step time s, fits in memory) of one representative step, None when it cannot run."""
    try:
        r = simulate(s, steps=1, mode=Mode.REPRESENTATIVE)
    except Exception:     # the chosen scenario's own simulation reports the reason later
        return None
    return r.step_time_s, r.fits


def fastest(variants: Sequence[Scenario], notes: list[str]) -> tuple[Scenario, tuple[Scenario, ...]]:
    """(the fastest variant that fits, every variant that fits), with a note of the choice;
    (the first variant, ()) when none fits or none runs."""
    timed: list[tuple[Scenario, tuple[float, bool] | None]] = []
    for v in variants:
        timed.append((v, step_or_none(v)))
        if timed[-1][1] is not None and not timed[-1][1][1]:    # out of memory: larger ones too
            break
    feasible = [(v, t[0]) for v, t in timed if t is not None and t[1]]
    if not feasible:
        notes.append("micro_batch 1 assumed (the row does not give it; no micro-batch of "
                     f"{', '.join(str(v.training.micro_batch) for v in variants)} fits)")
        return variants[0], ()
    best, _ = min(feasible, key=lambda vt: vt[1])
    tried = ", ".join(f"{v.training.micro_batch}: {t[0]:.3g} s" if t and t[1] else
                      f"{v.training.micro_batch}: {'out of memory' if t else 'not simulated'}"
                      for v, t in timed)
    notes.append(f"micro_batch {best.training.micro_batch} assumed: the row does not give it; the fastest "
                 f"that fits on the catalog clock ({tried}); `zerosim fit` chooses again under each clock")
    return best, tuple(v for v, _ in feasible)
