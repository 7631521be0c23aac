"""Which blocks full recomputation checkpoints, Megatron's way (megatron/core/transformer/
transformer_block.py `_checkpointed_forward`, `--recompute-method`, `--recompute-num-layers`).

- `uniform` with N: the stage's blocks are cut into chunks of N (the last may be shorter);
  each chunk keeps only its input and is recomputed whole before its backward, so N
  blocks' full activations are live at once while it is. N = 1 is every block
  checkpointed (what HF's gradient checkpointing and DeepSpeed's per-layer
  `checkpoint` do).
- `block` with N: the first N blocks of each pipeline stage are checkpointed one by one;
  the others keep all their activations and are not recomputed (less recompute, more
  memory).

The planners (sim.engines.skeleton), the memory report and the analytic twin's volumes and
FLOPs read the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.enums import Recompute

UNIFORM, BLOCK = "uniform", "block"
METHODS = (UNIFORM, BLOCK)


@dataclass(frozen=True, slots=True)
class RecomputePlan:
    method: str = UNIFORM
    layers: int = 1

    def segments(self, blocks: int) -> list[range]:
        """The stage-local block ranges recomputed as one checkpoint each, in order."""
        if self.method == BLOCK:
            return [range(i, i + 1) for i in range(min(self.layers, blocks))]
        return [range(i, min(i + self.layers, blocks)) for i in range(0, blocks, self.layers)]

    def recomputed(self, blocks: int) -> int:
        """Blocks of a stage whose forward runs again in backward."""
        return sum(len(r) for r in self.segments(blocks))

    def working(self, blocks: int) -> int:
        """Most blocks whose full activations are recomputed and live at once."""
        return max((len(r) for r in self.segments(blocks)), default=0)


def plan_of(recompute: Recompute, method: str, layers: int) -> RecomputePlan | None:
    """The plan of full recomputation; None when the blocks are not fully recomputed."""
    return RecomputePlan(method, layers) if recompute is Recompute.FULL else None


def kept_activation_bytes(blocks: int, plan: RecomputePlan | None, *, full: float, checkpoint: float) -> float:
    """Activation bytes a stage keeps for one micro-batch between its forward and backward:
    one checkpoint per segment, every activation of the blocks outside the segments."""
    if plan is None:
        return blocks * full
    recomputed = plan.recomputed(blocks)
    return len(plan.segments(blocks)) * checkpoint + (blocks - recomputed) * full
