"""DeepSpeed's PipelineEngine (sim.engines.policies.DeepSpeedTrainSchedule, the skeleton's
blocking sends and receives): the instruction order of pipe/schedule.py `TrainSchedule`,
sends that wait for the receiver, 1/tp partitions all-gathered on arrival, and the
gradient reduction after the stage's last send."""

from __future__ import annotations

import math

import pytest

from sim.core.enums import Coll
from sim.engines.plan import plan
from sim.engines.policies import DeepSpeedTrainSchedule, OneFOneB, Part, Pipe
from sim.engines.schedule import Axis, Collective, Direction, Send, Stream
from sim.simulate import simulate
from tests.crosscheck.scenarios import STRATEGIES, tiny

SHAPES = [(p, m) for p in (2, 3, 7) for m in (1, 2, 9)]


@pytest.mark.parametrize("stages,micro", SHAPES)
def test_passes_run_in_the_1f1b_order(stages: int, micro: int) -> None:
    """Only the transfers differ from Megatron's 1F1B: the passes come in the same order."""
    for stage in range(stages):
        ds = [(mb, d) for what, d, mb in DeepSpeedTrainSchedule().instructions(micro, stages, stage) if what is Pipe.PASS]
        one_f_one_b = [(mb, Direction.FORWARD if part is Part.FORWARD else Direction.BACKWARD)
                       for mb, part, _ in OneFOneB().order(micro, stages, stage)]
        assert ds == one_f_one_b


@pytest.mark.parametrize("stages,micro", SHAPES)
def test_every_send_has_its_receive_on_the_neighbour(stages: int, micro: int) -> None:
    order = [DeepSpeedTrainSchedule().instructions(micro, stages, s) for s in range(stages)]
    sends = sorted((s + (1 if d is Direction.FORWARD else -1), d, mb)
                   for s in range(stages) for what, d, mb in order[s] if what is Pipe.SEND)
    receives = sorted((s, d, mb) for s in range(stages) for what, d, mb in order[s] if what is Pipe.RECV)
    assert sends == receives and len(sends) == 2 * micro * (stages - 1)


def test_stage_1_of_3_issues_what_train_schedule_yields() -> None:
    """Stage 1 of 3, 3 micro-batches, worked by hand from TrainSchedule.steps before v0.9
    (what the simulator replays): ten steps,
    odd steps forward; an output leaves in the stage's next step (a forward step receives
    first and then sends the gradient, a backward step sends the activation first)."""
    F, B, R, S, P = Direction.FORWARD, Direction.BACKWARD, Pipe.RECV, Pipe.SEND, Pipe.PASS
    assert DeepSpeedTrainSchedule().instructions(3, 3, 1) == [
        (R, F, 0), (P, F, 0), (S, F, 0), (R, F, 1), (P, F, 1), (S, F, 1), (R, B, 0), (P, B, 0),
        (R, F, 2), (S, B, 0), (P, F, 2), (S, F, 2), (R, B, 1), (P, B, 1), (S, B, 1), (R, B, 2), (P, B, 2),
        (S, B, 2)]


def test_since_v0_9_a_forward_step_sends_first_and_a_backward_step_receives_first() -> None:
    """The same stage with `send_first` (DeepSpeed v0.9.0+, PR #2862), worked by hand from
    DeepSpeed 0.19.8's TrainSchedule.steps; a real run's order is checked in
    tests/validation/test_deepspeed_pipeline_runs.py."""
    F, B, R, S, P = Direction.FORWARD, Direction.BACKWARD, Pipe.RECV, Pipe.SEND, Pipe.PASS
    assert DeepSpeedTrainSchedule(send_first=True).instructions(3, 3, 1) == [
        (R, F, 0), (P, F, 0), (S, F, 0), (R, F, 1), (P, F, 1), (R, B, 0), (S, F, 1), (P, B, 0),
        (S, B, 0), (R, F, 2), (P, F, 2), (R, B, 1), (S, F, 2), (P, B, 1), (S, B, 1), (R, B, 2), (P, B, 2),
        (S, B, 2)]


def _ops(s, stage: int):
    return list(plan(s).classes[stage].ops())


def test_sends_wait_for_the_receiver_and_block_the_compute_stream() -> None:
    s = tiny("ds-zero1-tp2-pp2", grad_accum=3)
    for stage in (0, 1):
        ops = _ops(s, stage)
        by_id = {op.id: op for op in ops}
        data = [op for op in ops if isinstance(op, Send) and op.nbytes > 0]
        notices = [op for op in ops if isinstance(op, Send) and op.nbytes == 0]
        assert len(data) == len(notices) == 3            # each micro-step: one send and one posted receive
        assert all(op.tag.ready for op in notices) and not any(op.tag.ready for op in data)
        for send in data:
            assert any(t.ready for t in send.waits_for)          # the receiver has posted its receive
            after = [op for op in ops if op.stream is Stream.COMPUTE and op.id > send.id]
            assert after and send.id in after[0].deps            # blocking: compute waits for it
        assert {by_id[d].stream for op in notices for d in op.deps} <= {Stream.COMPUTE}


def test_under_tp_a_stage_sends_its_partition_and_all_gathers_what_it_receives() -> None:
    accum = 3
    s = tiny("ds-zero1-tp2-pp2", grad_accum=accum)
    whole = 2.0 * s.training.seq_len * s.training.micro_batch * s.model.hidden
    gathers = {}
    for stage in (0, 1):
        ops = _ops(s, stage)
        assert {op.nbytes for op in ops if isinstance(op, Send) and op.nbytes > 0} == {whole / 2}
        gathers[stage] = [op for op in ops if isinstance(op, Collective) and op.purpose == "pipeline"]
        assert all(op.coll is Coll.ALL_GATHER and op.axis is Axis.TP and op.nbytes == whole for op in gathers[stage])
    assert len(gathers[1]) == accum              # the received activation, each forward
    assert len(gathers[0]) == 2 * accum          # its own output and the received gradient, each backward
    without_tp = _ops(tiny("ds-zero1-pp2-first-1", grad_accum=accum), 0)
    assert not [op for op in without_tp if isinstance(op, Collective) and op.purpose == "pipeline"]


def test_the_gradient_reduction_follows_the_stages_last_send() -> None:
    """ReduceGrads runs in the schedule's last step: a stage's data-parallel reduction comes
    after it has sent its last gradient, not between that backward and the send."""
    s = tiny("ds-zero1-tp2-pp2", grad_accum=2)
    ops = _ops(s, 1)
    last_send = max(op.id for op in ops if isinstance(op, Send) and op.nbytes > 0)
    reductions = [op.id for op in ops if isinstance(op, Collective) and op.axis is Axis.DP]
    assert reductions and min(reductions) > last_send


@pytest.mark.parametrize("pp", [2, 4])
@pytest.mark.parametrize("accum", [1, 2, 5])
def test_the_blocking_pipeline_runs_to_the_end(pp: int, accum: int) -> None:
    s = tiny("ds-zero1-tp2-pp2", grad_accum=accum, strategy_table={"zero": {"stage": 1}, "parallel": {"pp": pp}})
    r = simulate(s)
    assert math.isfinite(r.step_time_s) and r.step_time_s > 0
    ran = {(sp.rank, sp.op.id) for sp in r.engine.spans}
    for k, rank in enumerate(r.layout.representatives):
        assert {(rank, op.id) for op in r.schedule.classes[k].ops()} <= ran


def test_megatron_pipelines_keep_their_non_blocking_sends() -> None:
    s = tiny("megatron-distopt-tp2-pp2", grad_accum=2)
    sends = [op for op in _ops(s, 0) if isinstance(op, Send)]
    assert sends and not any(op.tag.ready or op.waits_for for op in sends)
    assert STRATEGIES["megatron-distopt-tp2-pp2"]["parallel"]["pp"] == 2
