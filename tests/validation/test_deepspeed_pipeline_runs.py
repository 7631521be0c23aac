"""DeepSpeed's PipelineEngine on gloo (3 stages, 4 micro-batches): the sends and receives of
a step in the order a real run issues them, against sim.engines.policies.DeepSpeedTrainSchedule,
and in bytes and number against the planned pipeline."""

from __future__ import annotations

import pytest

from sim.engines.plan import plan
from sim.engines.policies import DeepSpeedTrainSchedule, Pipe
from sim.engines.schedule import Direction, Send
from sim.validate.compare import validation_scenario
from sim.validate.torch_runs import spawn

pytest.importorskip("deepspeed")   # in the test extra; skipped only where it is not installed

STAGES, ACCUM = 3, 4
MODEL = {"layers": 3, "hidden": 128, "heads": 4, "kv_heads": 2, "ffn_hidden": 384, "vocab": 2048}
CONFIG = {"model": MODEL, "seq_len": 32, "micro_batch": 2, "grad_accum": ACCUM, "steps": 2, "zero": {"stage": 1}}


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    """One run; the first step also sends the tensors' shapes, so the second is compared."""
    return sorted(spawn(STAGES, "train_deepspeed_pipe", CONFIG), key=lambda r: r["stage"])


def _p2p(rank: dict) -> list[tuple[str, int, int]]:
    return [(e["op"], e["peer"], e["nbytes"]) for e in rank["log"] if e["phase"] == "1/pipeline" and e["op"] in ("send", "recv")]


def _peer(stage: int, what: Pipe, direction: Direction) -> int:
    """Whom a transfer goes to or comes from: activations flow to the next stage."""
    return stage + 1 if (what is Pipe.SEND) == (direction is Direction.FORWARD) else stage - 1


def test_sends_and_receives_come_in_train_schedules_order(ranks: list[dict]) -> None:
    """DeepSpeed 0.19's order (`send_first`): a forward step sends the previous gradient
    before it receives, a backward step receives before it sends the previous activation."""
    for stage, rank in enumerate(ranks):
        order = DeepSpeedTrainSchedule(send_first=True).instructions(ACCUM, STAGES, stage)
        want = [(what.value, _peer(stage, what, d)) for what, d, _ in order if what is not Pipe.PASS]
        assert [(op, peer) for op, peer, _ in _p2p(rank)] == want


def test_the_plan_moves_the_same_transfers(ranks: list[dict]) -> None:
    """The planned pipeline (each receive a zero-byte notice to the stage it receives from)
    sends and receives what the run does, to and from the same stages, one fp32 s b h
    activation or gradient each."""
    s = validation_scenario("deepspeed-zero1", MODEL, STAGES, seq_len=32, micro_batch=2, grad_accum=ACCUM, pp=STAGES)
    schedule = plan(s)
    for stage, rank in enumerate(ranks):
        sends = [op for op in schedule.classes[stage].ops() if isinstance(op, Send)]
        planned = sorted(("recv" if op.tag.ready else "send", stage + op.peer) for op in sends)
        recorded = _p2p(rank)
        assert sorted((op, peer) for op, peer, _ in recorded) == planned
        assert {n for _, _, n in recorded} == {int(op.nbytes) for op in sends if not op.tag.ready} == {4 * 32 * 2 * 128}
