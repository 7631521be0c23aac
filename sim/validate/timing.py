"""Predicted vs measured step time of the real runs, with a calibrated profile.

The development machine is a 2-vCPU virtual machine whose speed drifts: a fixed GEMM runs
at 49 to 66 GFLOP/s from one second to the next, and one strategy's median step moves by
10-30% between runs minutes apart. A single calibrate-then-measure pass therefore says more
about the machine's mood than about the model. `timing_rounds` repeats the pair: each round
calibrates afresh, measures every strategy right after (in an order rotated per round) and
predicts from that round's profile; `summarise` gives each strategy's median error over the
rounds and its range, which is what the 10% target is judged on.

What drifts between the calibration and a run is the machine, not the model, so each run
also measures it: the processes time the calibration's own GEMM set (`gemm_rate`, median of
windows, every process at once) just before and just after their training steps, and the
drift-adjusted prediction is the profile's prediction x (the profile's GEMM rate / the rate
around the run): the machine ran that much faster or slower than when it was calibrated,
the whole step with it (GEMMs are 70% of this step; its Python, memory-bound kernels and
gloo copies run on the same cores). Both errors are reported, raw and adjusted."""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sim.simulate import simulate
from sim.validate.calibrate import gemm_shapes
from sim.validate.compare import validation_scenario
from sim.validate.torch_runs import spawn

TIMING_MODEL = {"layers": 4, "hidden": 256, "heads": 8, "kv_heads": 4, "ffn_hidden": 688, "vocab": 4096}
TIMING_RUN = {"seq_len": 128, "micro_batch": 4, "grad_accum": 2}
STRATEGIES = ("ddp", "ddp-zero-redundancy", "fsdp2", "fsdp2-no-reshard")
DEEPSPEED = ("deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3")


def profile_for(profile_dir: Path, world: int) -> Path:
    return profile_dir / f"local-cpu-calibrated-w{world}.toml"


def default_strategies() -> tuple[str, ...]:
    """The torch strategies, and DeepSpeed's when it is installed."""
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        return STRATEGIES
    return STRATEGIES + DEEPSPEED


def timing_gemms() -> list[tuple[int, int, int]]:
    """The GEMM set calibrate measures for the timing model (and runs re-measure)."""
    return gemm_shapes(TIMING_MODEL, TIMING_RUN["seq_len"] * TIMING_RUN["micro_batch"])


WARMUP_STEPS = 2
TIMED_STEPS = 9


def measured_step(strategy: str, world: int, steps: int = TIMED_STEPS) -> tuple[float, float, list[float]]:
    """(median over steps `WARMUP_STEPS` + 1 .. `steps` of the slowest rank's step in
    seconds, the GEMM FLOP/s the processes measured around their steps, median over ranks,
    every step's slowest rank in seconds).

    The simulator predicts a steady step, so the warm-up is left out: the first step builds
    the engines' buffers and fills the allocator (1.2-1.6 x the steady step), and the second
    still ran 3-16% above the median of the seven after it in three of four DeepSpeed ZeRO-2
    and ZeRO-3 runs of this model (2026-12-07, docs/validation.md). Until then the median
    of steps 2-5 was taken."""
    config = {"model": TIMING_MODEL, "steps": steps, "strategy": strategy, "record": False,
              "speed_probe": timing_gemms(), **TIMING_RUN}
    if strategy.startswith("deepspeed"):
        config["zero"] = {"stage": int(strategy[-1])}
    ranks = spawn(world, "train_deepspeed" if strategy.startswith("deepspeed") else "train_llama", config)
    slowest = [max(r["step_s"][i] for r in ranks) for i in range(steps)]
    return steady_step(slowest), statistics.median(r["probe_flops"] for r in ranks), slowest


def steady_step(steps_s: list[float]) -> float:
    """The median of the steps after the `WARMUP_STEPS` warm-up steps."""
    if len(steps_s) <= WARMUP_STEPS:
        raise ValueError(f"{len(steps_s)} steps timed: more than {WARMUP_STEPS} warm-up steps are needed")
    return statistics.median(steps_s[WARMUP_STEPS:])


def predicted_step(profile: Path, strategy: str, world: int) -> tuple[float, float]:
    """(the simulator's step time on `profile`, the profile's GEMM FLOP/s)."""
    s = validation_scenario(strategy, TIMING_MODEL, world, cluster=str(profile), seq_len=TIMING_RUN["seq_len"],
                            micro_batch=TIMING_RUN["micro_batch"], grad_accum=TIMING_RUN["grad_accum"])
    gpu = s.cluster.gpu
    return simulate(s).step_time_s, gpu.peak_flops("fp32") * gpu.matmul_efficiency


def predicted_vs_measured(profile: Path, world: int, strategies: tuple[str, ...] | None = None,
                          steps: int = TIMED_STEPS) -> list[dict[str, Any]]:
    """One row per strategy: measured median step (after the warm-up), predicted, the error,
    and the drift-adjusted prediction and error (module docstring)."""
    rows = []
    for strategy in strategies or default_strategies():
        measured, probe, slowest = measured_step(strategy, world, steps)
        predicted, calibrated = predicted_step(profile, strategy, world)
        adjusted = predicted * calibrated / probe
        rows.append({"strategy": strategy, "world": world, "measured_s": measured, "predicted_s": predicted,
                     "error": predicted / measured - 1, "speed": probe / calibrated, "adjusted_s": adjusted,
                     "adjusted_error": adjusted / measured - 1, "steps_s": slowest})
    return rows


def rotated(items: tuple[str, ...], by: int) -> tuple[str, ...]:
    k = by % len(items) if items else 0
    return items[k:] + items[:k]


def timing_rounds(rounds: int, worlds: tuple[int, ...], calibrate_into: Callable[[Path, tuple[int, ...]], Any],
                  strategies: tuple[str, ...] | None = None, report: Callable[[dict[str, Any]], None] | None = None,
                  ) -> list[dict[str, Any]]:
    """`rounds` x (calibrate into a fresh folder, then measure and predict every strategy on
    each world, the strategy order rotated by the round number). Returns every row, with
    its round; `report` sees each row as it comes."""
    names = strategies or default_strategies()
    rows = []
    for r in range(rounds):
        with tempfile.TemporaryDirectory(prefix="zerosim-timing-") as tmp:
            calibrate_into(Path(tmp), worlds)
            for world in worlds:
                for row in predicted_vs_measured(profile_for(Path(tmp), world), world, rotated(names, r)):
                    row["round"] = r
                    rows.append(row)
                    if report:
                        report(row)
    return rows


PREDICTION = {"error": "predicted_s", "adjusted_error": "adjusted_s"}


def summarise(rows: list[dict[str, Any]], within: float = 0.10, key: str = "adjusted_error") -> list[dict[str, Any]]:
    """Per (strategy, world), in first-seen order: the median of `key` (the drift-adjusted
    error by default, or "error") over the rounds, the lowest and highest, the median raw
    error, the median measured and predicted seconds, and whether the median is within
    `within`."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["strategy"], row["world"]), []).append(row)
    out = []
    for (strategy, world), g in groups.items():
        errors = [x[key] for x in g]
        median = statistics.median(errors)
        out.append({"strategy": strategy, "world": world, "rounds": len(g), "median_error": median,
                    "min_error": min(errors), "max_error": max(errors),
                    "raw_error": statistics.median(x["error"] for x in g),
                    "measured_s": statistics.median(x["measured_s"] for x in g),
                    "predicted_s": statistics.median(x[PREDICTION[key]] for x in g), "within": abs(median) <= within})
    return out
