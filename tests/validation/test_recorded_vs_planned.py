"""Real torch runs (gloo, CPU) against the planner: the collectives of a step, in order and
bytes, and the bytes of parameters, gradients and optimizer state per rank; with 4 ranks also
FSDP2's HSDP (2 replicas x 2 shards) and an int reshard_after_forward (2-way of 4)."""

from __future__ import annotations

import pytest

from sim.validate.compare import planned, planned_state, recorded, validation_scenario
from sim.validate.torch_runs import spawn

MODEL = {"layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2, "ffn_hidden": 384, "vocab": 2048}
STRATEGIES = ("ddp", "ddp-zero-redundancy", "fsdp2", "fsdp2-no-reshard")
MESHES = ("fsdp2-hsdp", "fsdp2-reshard-2")      # need 4 ranks: a 2 x 2 replicate x shard mesh; 2-way of 4
TWO_D = "fsdp2-tp2"                             # torchtitan's FSDP2 + TP on a 2 (dp) x 2 (tp) mesh
RUNS = ((2, 1), (4, 2))     # (world, gradient accumulation)
CASES = [(world, accum, strategy) for world, accum in RUNS for strategy in STRATEGIES + (MESHES if world == 4 else ())]


@pytest.fixture(scope="module")
def runs():
    """Every strategy of a world in one process group (the `cases` worker), started once per
    world when a test first asks for it: (world, accum) -> strategy -> the ranks' results."""
    done: dict[tuple[int, int], dict[str, list]] = {}

    def of(world: int, accum: int) -> dict[str, list]:
        if (world, accum) not in done:
            names = STRATEGIES + ((*MESHES, TWO_D) if world == 4 else ())
            cases = [{"model": MODEL, "seq_len": 32, "micro_batch": 2, "grad_accum": accum, "steps": 3,
                      "strategy": s} for s in names]
            ranks = spawn(world, "cases", {"worker": "train_llama", "cases": cases})
            done[(world, accum)] = {s: [r["cases"][i] for r in ranks] for i, s in enumerate(names)}
        return done[(world, accum)]
    return of


@pytest.fixture(params=CASES, ids=lambda c: f"{c[2]}-world{c[0]}-accum{c[1]}")
def case(request, runs):
    world, accum, strategy = request.param
    scenario = validation_scenario(strategy, MODEL, world, seq_len=32, micro_batch=2, grad_accum=accum)
    return scenario, runs(world, accum)[strategy]


def test_collective_sequence_matches_exactly(case):
    scenario, ranks = case
    plan = planned(scenario)
    assert plan, "the plan has collectives"
    for rank in ranks:   # step 2: past DDP's one-time bucket rebuild after the first step
        assert recorded(rank["log"], 2) == plan


def test_memory_per_rank_matches_exactly(case):
    scenario, ranks = case
    plan = planned_state(scenario)
    held = {k: max(r["state"][k] for r in ranks) for k in plan}   # the most loaded rank
    assert held == plan


def test_fsdp2_with_tp_matches_in_its_data_parallel_collectives_and_state(runs):
    """The FSDP collectives of the 2D layout and every rank's shard bytes match the plan
    exactly; DTensor's tensor-parallel collectives (recorded as functional collectives) are
    the plan's per block (an all-gather and a reduce-scatter around attention and MLP, each
    way) plus what DTensor adds around them per micro-step, which the model leaves out: the
    vocab-parallel embedding's forward is a reduce-scatter alone and its backward an
    all-gather; the head gathers its input and (output Replicate, no loss parallelism) the
    logits forward and reduce-scatters its input's gradient; the replicated norm weights of
    SequenceParallel all-reduce their gradients (two per block and the final norm's)."""
    ranks = runs(4, 2)[TWO_D]
    s = validation_scenario(TWO_D, MODEL, 4, seq_len=32, micro_batch=2, grad_accum=2)
    for rank in ranks:
        assert recorded(rank["log"], 2, functional=False) == planned(s, tensor_parallel=False)
    held = {k: max(r["state"][k] for r in ranks) for k in planned_state(s)}
    assert held == planned_state(s)
    tp_recorded = [e for e in ranks[0]["log"] if e["phase"].startswith("2/") and e.get("functional")]
    tp_planned = len(planned(s)) - len(planned(s, tensor_parallel=False))
    blocks, micro_steps = MODEL["layers"], 2
    dtensor_extra = -1 + 2 + 1 + 2 * blocks + 1 + 1      # embedding, head forward, head backward, norms, embedding
    assert len(tp_recorded) == tp_planned + micro_steps * dtensor_extra
    norm_grads = [e for e in tp_recorded if e["op"] == "all_reduce"]
    assert len(norm_grads) == micro_steps * (2 * blocks + 1) and {e["nbytes"] for e in norm_grads} == {4 * 128}