"""What a published row's own source states about the run in another place than the row's
cells: a table caption, the paper's text, the companion benchmark page the same team
published for the same experiment, or the launch recipe the publication points to.

Each entry adds text to the row's `other_config` cell, as if the row had noted it, and the
harness records it among the row's assumptions with the source. Only facts a source states
go here, never a value chosen to move a prediction; a row whose reading is disputed stays
as its cells say. Entries are per row (`STATED_ELSEWHERE`) or per publication
(`STATED_BY_SOURCE`, matched on the row's source_url).
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


# source_url fragment -> (text added to other_config, where the source states it)
STATED_BY_SOURCE: dict[str, tuple[str, str]] = {
    "2022/07/26/deepspeed-azure": (
        "reduce_bucket_size 9e7; max_live_parameters 3e9; max_reuse_distance 3e9; "
        "offload_optimizer.pin_memory true",
        "the Azure recipes the post links for its runs (deepspeedai/Megatron-DeepSpeed "
        "examples_deepspeed/azure/run-175b.sh and run-1t.sh, one ds_config for both: "
        "reduce_bucket_size 90000000, stage3_max_live_parameters 3e9, stage3_max_reuse_distance "
        "3e9, offload_optimizer.pin_memory true (with an offloaded optimizer it pins the host "
        "gradient buffer each reduced partition goes through; v0.6's boundary copy to the fp32 "
        "gradient stays blocking and pageable); its other ZeRO keys are DeepSpeed's defaults); "
        "the post offers its setup for reproducing its results"),
}


def with_stated_context(f: Mapping[str, str], notes: list[str]) -> Mapping[str, str]:
    """The row's fields with what its source states elsewhere added to other_config."""
    url = f.get("source_url", "")
    row_id = f.get("id", "")
    entries = [STATED_ELSEWHERE[row_id]] if row_id in STATED_ELSEWHERE else []
    entries += [e for fragment, e in STATED_BY_SOURCE.items() if fragment in url]
    for text, where in entries:
        notes.append(f"{text} (not in the row's cells; stated by {where})")
        other = f.get("other_config", "")
        f = {**f, "other_config": f"{other}; {text}" if other else text}
    return f
