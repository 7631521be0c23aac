"""Which transformer blocks each pipeline stage holds.

By default the p stages share the L blocks evenly (Megatron-LM asserts p divides L), the
first stage also holding the embedding and the last the final norm and head. Because those
make the end stages heavier, the engines let a run give them fewer blocks:
Megatron-Core's `--decoder-first-pipeline-num-layers` / `--decoder-last-pipeline-num-layers`
(megatron/core/transformer/transformer_block.py `get_num_layers_to_build`: the other
stages share the rest evenly), torchtitan's `pipeline_parallel_split_points`, DeepSpeed's
PipelineModule partitions. `[parallel] first_stage_layers` / `last_stage_layers` say so
here; the rest is divided evenly among the other stages, which must come out whole.
Interleaved schedules (model chunks per stage) keep the even split.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Stages:
    """The pipeline split of `layers` blocks over `pp` stages; `first` / `last` are the end
    stages' blocks when given (0: their even share)."""

    layers: int
    pp: int
    first: int = 0
    last: int = 0

    @property
    def uneven(self) -> bool:
        return bool(self.first or self.last)

    def problem(self) -> str | None:
        """Why this split cannot be built, or None."""
        if not self.uneven:
            return None if self.layers % self.pp == 0 else \
                f"pp ({self.pp}) does not divide the {self.layers} layers"
        if self.pp < 2:
            return "first / last stage layers need pp >= 2"
        ends = int(bool(self.first)) + int(bool(self.last))
        rest, others = self.layers - self.first - self.last, self.pp - ends
        if rest < 0 or (others == 0 and rest) or (others > 0 and (rest <= 0 or rest % others)):
            return (f"{self.layers} layers less {self.first + self.last} on the end stages leave {rest} for the "
                    f"other {others} stage(s): not a whole positive number each")
        return None

    def counts(self) -> tuple[int, ...]:
        """Blocks per stage, first to last."""
        if not self.uneven:
            return (self.layers // self.pp,) * self.pp
        ends = int(bool(self.first)) + int(bool(self.last))
        others = self.pp - ends
        share = (self.layers - self.first - self.last) // others if others else 0
        out = [share] * self.pp
        if self.first:
            out[0] = self.first
        if self.last:
            out[-1] = self.last
        return tuple(out)

    def blocks(self, stage: int) -> range:
        """The model blocks stage `stage` holds."""
        counts = self.counts()
        start = sum(counts[:stage])
        return range(start, start + counts[stage])

    def stage_of(self, block: int) -> int:
        """The stage that holds model block `block`."""
        end = 0
        for stage, n in enumerate(self.counts()):
            end += n
            if block < end:
                return stage
        raise ValueError(f"block {block} beyond the {self.layers} layers")


def embedding_balanced_ends(layers: int, pp: int) -> int:
    """Blocks on each end stage when the embedding and the head count as a block each and
    the p stages share layers + 2 evenly, (layers + 2) / p - 1 (DeepSpeed's
    'type:transformer|embedding' partition; Llama 3's 126 layers on 16 stages: 7, 14 x 8, 7);
    0 when that split is not a whole, uneven one (p < 3, p dividing the layers or not
    layers + 2, or no block left on the ends)."""
    if pp < 3 or layers % pp == 0 or (layers + 2) % pp:
        return 0
    return (layers + 2) // pp - 1


def as_stages(layers: int, pp: int | Stages) -> Stages:
    """`pp` as a split: a plain degree is the even split of `layers` blocks."""
    return pp if isinstance(pp, Stages) else Stages(layers, pp)
