"""bench/deepspeed_pipe_schedule.py: DeepSpeed's TrainSchedule against the simulator's 1F1B.

The estimate in docs/fidelity.md rests on three properties checked here: DeepSpeed's
passes run in exactly the simulator's 1F1B order (only the sends differ), its blocking
instruction streams pair up without deadlock, and blocking costs nothing when transfers
are free but is never faster than 1F1B when they are not.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from deepspeed_pipe_schedule import deepspeed_instructions, deepspeed_time, one_f_one_b_time  # noqa: E402

from sim.engines.policies import OneFOneB, Part  # noqa: E402

SHAPES = [(p, m) for p in (2, 3, 7) for m in (1, 2, 9)]


@pytest.mark.parametrize("stages,micro", SHAPES)
def test_passes_run_in_the_simulators_1f1b_order(stages: int, micro: int) -> None:
    for stage in range(stages):
        deepspeed = [(mb, what) for kind, what, mb in deepspeed_instructions(stages, micro, stage) if kind == "pass"]
        replayed = [(mb, "F" if part is Part.FORWARD else "B") for mb, part, _ in OneFOneB().order(micro, stages, stage)]
        assert deepspeed == replayed


@pytest.mark.parametrize("stages,micro", SHAPES)
def test_every_send_meets_its_receive(stages: int, micro: int) -> None:
    programs = [list(deepspeed_instructions(stages, micro, s)) for s in range(stages)]
    sends = sorted((s, what, mb) for s in range(stages) for kind, what, mb in programs[s] if kind == "send")
    recvs = sorted((s - 1 if what == "act" else s + 1, what, mb)
                   for s in range(stages) for kind, what, mb in programs[s] if kind == "recv")
    assert sends == recvs
    assert len(sends) == 2 * micro * (stages - 1)
    deepspeed_time(stages, micro, 0.1)             # raises on a deadlock


@pytest.mark.parametrize("stages,micro", SHAPES)
def test_blocking_costs_only_with_transfers(stages: int, micro: int) -> None:
    assert deepspeed_time(stages, micro, 0.0) == pytest.approx(one_f_one_b_time(stages, micro, 0.0))
    assert deepspeed_time(stages, micro, 0.0) == pytest.approx((micro + stages - 1) * 4.0)
    assert deepspeed_time(stages, micro, 0.1) >= one_f_one_b_time(stages, micro, 0.1) - 1e-9


def test_steady_state_pays_the_transfers_in_series() -> None:
    """A long pipeline of many micro-batches: 1F1B hides the transfers behind compute, the
    blocking pairs put them in series, a few per cent at 3% of a forward each."""
    ratio = deepspeed_time(12, 128, 0.03) / one_f_one_b_time(12, 128, 0.03)
    assert 1.005 < ratio < 1.05
