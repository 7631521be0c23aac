"""How much a scenario may ask for: sizes of models and clusters, and the engine's work.

Two kinds of limit, both refused with exit 2 before any work starts:

- Key limits: far above anything built or published (with the largest known value in
  the comment), low enough that no closed form overflows and no loop runs away. A value
  beyond them is a typo or an attack, not a model.
- Work limits of `zerosim run`: the discrete-event engine executes about 20,000-60,000
  ops per second on one core (bench/engine_speed.py, docs/benchmarks.md), so the ops a
  scenario asks for (planned ops per rank class x simulated ranks x steps) are capped at
  `MAX_SIMULATED_OPS`, about two minutes of engine time; the schedule held in memory is
  capped at `MAX_PLANNED_OPS` (about 1 KB per op). `estimated_ops` gives the estimate
  from the model's structure without building anything.
"""

from __future__ import annotations

from dataclasses import dataclass

# -- model (models/*.toml, [model], HF config.json) ------------------------------------------
MAX_LAYERS = 1_000           # Llama-3.1-405B 126, Megatron 1T 128, PaLM 118
MAX_HIDDEN = 131_072         # Megatron 1T 25,600
MAX_HEADS = 4_096            # Megatron 1T 160
MAX_HEAD_DIM = 4_096         # 128-256 in practice
MAX_FFN_HIDDEN = 1_048_576   # Megatron 1T 102,400; GLaM experts 32,768
MAX_VOCAB = 4_194_304        # Gemma 256,000
MAX_POSITIONS = 16_777_216   # learned position tables: GPT-2 1,024
MAX_EXPERTS = 4_096          # Switch-C 2,048, DeepSeek-V3 256
# -- cluster and layout (scenarios, hardware/*.toml) -----------------------------------------
MAX_NODES = 131_072          # the largest published jobs: ~24,576 GPUs (Llama 3), 100k-GPU sites
MAX_GPUS_PER_NODE = 576      # GB200 NVL576 is the largest NVLink domain announced
MAX_WORLD = 1_048_576
# -- training ----------------------------------------------------------------------------------
MAX_SEQ_LEN = 16_777_216     # 1M-token context runs exist
MAX_MICRO_BATCH = 1_048_576
MAX_BATCH = 2**40            # sequences per step; analytic, so only overflow matters
MAX_STEPS = 1_000            # --steps: each step runs the whole schedule again
# -- engine work (zerosim run) ------------------------------------------------------------------
MAX_PLANNED_OPS = 2_000_000
MAX_SIMULATED_OPS = 4_000_000
OPS_PER_MODULE_USE = 6       # ops per granule per micro-step, measured on the bundled scenarios:
OPS_PER_BLOCK_USE = 12       # 4.0-5.4 per module (ZeRO-1/2/3, DDP), 8.5 per block (FSDP2)


@dataclass(frozen=True, slots=True)
class Work:
    """What `zerosim run` would ask of the engine, estimated before planning."""

    planned_ops: int       # ops in the schedule (all rank classes)
    simulated_ops: int     # op executions over all simulated ranks and steps

    def problem(self) -> str | None:
        """Why this is too much, in words, or None."""
        if self.planned_ops > MAX_PLANNED_OPS:
            return (f"the schedule would hold about {self.planned_ops:,} ops; allowed: at most "
                    f"{MAX_PLANNED_OPS:,} (fewer micro-steps per step, fewer layers or experts)")
        if self.simulated_ops > MAX_SIMULATED_OPS:
            return (f"the engine would execute about {self.simulated_ops:,} ops (about "
                    f"{self.simulated_ops / 30_000:,.0f} s here); allowed: at most {MAX_SIMULATED_OPS:,} "
                    "(fewer --steps, fewer micro-steps, or --mode representative)")
        return None


def estimated_ops(units_per_micro_step: int, per_module: bool, micro_steps: int,
                  simulated_ranks_per_class: int, steps: int) -> Work:
    """Planned ops ~ ops per use x units x micro-steps (the units of every pipeline stage
    together); simulated ~ planned x ranks simulated per class x steps."""
    per_use = OPS_PER_MODULE_USE if per_module else OPS_PER_BLOCK_USE
    planned = per_use * units_per_micro_step * micro_steps
    return Work(planned_ops=planned, simulated_ops=planned * simulated_ranks_per_class * steps)
