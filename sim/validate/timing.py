"""Predicted vs measured step time of the real runs, with a calibrated profile."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from sim.simulate import simulate
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


def predicted_vs_measured(profile: Path, world: int, strategies: tuple[str, ...] | None = None,
                          steps: int = 5) -> list[dict[str, Any]]:
    """One row per strategy: measured median step (after the first), predicted, error."""
    strategies = strategies or default_strategies()
    rows = []
    for strategy in strategies:
        config = {"model": TIMING_MODEL, "steps": steps, "strategy": strategy, "record": False, **TIMING_RUN}
        if strategy.startswith("deepspeed"):
            config["zero"] = {"stage": int(strategy[-1])}
        ranks = spawn(world, "train_deepspeed" if strategy.startswith("deepspeed") else "train_llama", config)
        measured = statistics.median(max(r["step_s"][i] for r in ranks) for i in range(1, steps))
        s = validation_scenario(strategy, TIMING_MODEL, world, cluster=str(profile), seq_len=TIMING_RUN["seq_len"],
                                micro_batch=TIMING_RUN["micro_batch"], grad_accum=TIMING_RUN["grad_accum"])
        predicted = simulate(s).step_time_s
        rows.append({"strategy": strategy, "world": world, "measured_s": measured, "predicted_s": predicted,
                     "error": predicted / measured - 1})
    return rows
