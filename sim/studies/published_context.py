"""What a published row's own source states about the run in another place than the row's
cells: a table caption, the paper's text, or the companion benchmark page the same team
published for the same experiment.

Each entry adds text to the row's `other_config` cell, as if the row had noted it, and the
harness records it among the row's assumptions with the source. Only facts a source states
go here, never a value chosen to move a prediction; a row whose reading is disputed stays
as its cells say.
"""

from __future__ import annotations

from collections.abc import Mapping

# id -> (text added to other_config, where the source states it)
STATED_ELSEWHERE: dict[str, tuple[str, str]] = {
    "VP455": ("torch.compile, Float8",
              "torchtitan's benchmark page for the same experiment (pytorch/torchtitan "
              "benchmarks/llama3_h100_202412_torchtitan.md, Table 4: Llama 3.1 70B on 256 H100, "
              "FSDP 32 x TP 8, local batch 16, global 512, full AC) is captioned '2D parallelism "
              "(FSDP + TP) + torch.compile + Float8'; the paper's abstract counts its 2D gain as "
              "'additional' to the 1D stack of torch.compile and Float8 (arXiv 2410.06511)"),
}


def with_stated_context(f: Mapping[str, str], notes: list[str]) -> Mapping[str, str]:
    """The row's fields with what its source states elsewhere added to other_config."""
    entry = STATED_ELSEWHERE.get(f.get("id", ""))
    if entry is None:
        return f
    text, where = entry
    notes.append(f"{text} (not in the row's cells; stated by {where})")
    other = f.get("other_config", "")
    return {**f, "other_config": f"{other}; {text}" if other else text}
