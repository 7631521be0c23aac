"""Real gloo runs of Hugging Face's LlamaForCausalLM, built by transformers from a config,
against the planner: DDP and ZeroRedundancyOptimizer broadcast the rotary buffers before the
first forward of each step (torch's `broadcast_buffers`), and FSDP2 with the root resharded
(`fully_shard(root, reshard_after_forward=True)`) gathers the root again as backward begins.
Collective by collective, in order and bytes."""

from __future__ import annotations

import pytest

from sim.validate.compare import planned, recorded, validation_scenario
from sim.validate.torch_runs import spawn

pytest.importorskip("transformers")

MODEL = {"layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2, "ffn_hidden": 384, "vocab": 2048}
CASES = {   # id: (strategy, options of the run and the scenario)
    "ddp": ("ddp", {}),
    "ddp-no-buffer-broadcast": ("ddp", {"broadcast_buffers": False}),
    "ddp-zero-redundancy": ("ddp-zero-redundancy", {}),
    "fsdp2-root-default": ("fsdp2", {}),
    "fsdp2-root-resharded": ("fsdp2", {"reshard_root": True}),
    "fsdp2-no-reshard-root-resharded": ("fsdp2-no-reshard", {"reshard_root": True}),
}


@pytest.fixture(scope="module")
def runs():
    """All cases in one process group per rank (transformers is imported once)."""
    cfgs = [{"model": MODEL, "seq_len": 32, "micro_batch": 2, "grad_accum": 2, "steps": 3, "hf": True,
             "strategy": strategy, **options} for strategy, options in CASES.values()]
    ranks = spawn(2, "cases", {"worker": "train_llama", "cases": cfgs})
    return {case: [r["cases"][i] for r in ranks] for i, case in enumerate(CASES)}


@pytest.mark.parametrize("case", list(CASES))
def test_hf_llama_collectives_match_the_plan_exactly(runs, case):
    strategy, options = CASES[case]
    scenario = validation_scenario(strategy, MODEL, 2, seq_len=32, micro_batch=2, grad_accum=2, **options)
    plan = planned(scenario)
    for rank in runs[case]:
        assert recorded(rank["log"], 2) == plan


def test_the_buffer_broadcast_and_the_root_regather_are_there(runs):
    """The two schedule misses, seen in the recordings themselves."""
    def ops(case):
        return recorded(runs[case][0]["log"], 2)
    assert ops("ddp")[0] == ("forward", "broadcast", 2 * (128 // 4 // 2) * 4, 2)   # inv_freq + original_inv_freq
    assert not any(op == "broadcast" for _, op, _, _ in ops("ddp-no-buffer-broadcast"))
    gathers = [n for phase, op, n, _ in ops("fsdp2-root-resharded") if op == "all_gather" and phase == "backward"]
    default = [n for phase, op, n, _ in ops("fsdp2-root-default") if op == "all_gather" and phase == "backward"]
    assert len(gathers) == len(default) + 2 and gathers[0] == max(gathers)   # the root, once per micro-step
