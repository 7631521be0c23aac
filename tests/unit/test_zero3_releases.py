"""DeepSpeed ZeRO-3's gradient offload by release (`[zero] deepspeed_version`,
sim.engines.deepspeed_zero3 `_gradients_to_host`): since v0.19.5 (PR #8207) each reduced
partition is cast to fp32 on the GPU and copied to the host without blocking, into pinned
memory by default; from v0.6.0 to v0.19.4 (`"0.6"`) `fp32_grad_tensor.copy_(grad_buffer)`
blocks the host and stages the 16-bit values through a fresh pageable tensor, and
`pin_memory` defaults to false."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.simulate import simulate
from tests.crosscheck.scenarios import tiny

OFFLOAD = {"offload_optimizer": "cpu", "offload_param": "none"}


def runs(version: str):
    s = tiny("ds-zero3-offload", nodes=2, extra_zero={**OFFLOAD, "deepspeed_version": version})
    return s, simulate(s)


@pytest.fixture(scope="module")
def both():
    return runs("0.19"), runs("0.6")


def gradient_copies(result):
    return [op for op in result.schedule.ops(0) if op.name.startswith("D2H gradient partition")]


def test_today_copies_fp32_without_blocking_and_then_blocked(both):
    (now_s, now), (then_s, then) = both
    new, old = gradient_copies(now), gradient_copies(then)
    assert len(new) == len(old) > 1
    assert sum(op.nbytes for op in new) == pytest.approx(2 * sum(op.nbytes for op in old))   # 4 B against 2 B
    assert not any(op.pageable for op in new) and all(op.pageable for op in old)
    waited = {ref for op in then.schedule.ops(0) for ref in op.synced}
    assert {op.id for op in old} <= waited                    # the host waits for every blocking copy
    waited_now = {ref for op in now.schedule.ops(0) for ref in op.synced}
    assert {op.id for op in new} & waited_now <= {new[-1].id}   # today only the backward's epilogue waits
    assert then.step_time_s > now.step_time_s
    assert then.breakdown.exposed_offload_s > now.breakdown.exposed_offload_s


def test_pin_memory_defaults_to_the_releases_default(both):
    (now_s, _), (then_s, _) = both
    assert now_s.zero.offload_optimizer.pin_memory and not then_s.zero.offload_optimizer.pin_memory
    pinned = tiny("ds-zero3-offload", nodes=2, extra_zero={"deepspeed_version": "0.6",
                                                           "offload_optimizer": {"device": "cpu", "pin_memory": True}})
    assert pinned.zero.offload_optimizer.pin_memory


def test_without_offload_the_releases_run_the_same_plan():
    now, then = (simulate(tiny("ds-zero3-prefetch", nodes=2, extra_zero={"deepspeed_version": v}))
                 for v in ("0.19", "0.6"))
    assert then.step_time_s == now.step_time_s
    assert replace(then.scenario.zero, deepspeed_version="0.19") == now.scenario.zero


def test_the_memory_estimate_prefetches_as_today():
    from sim.results.memory_report import scenario_report
    now, then, legacy = (scenario_report(tiny("ds-zero3-prefetch", nodes=2, extra_zero={"deepspeed_version": v}))
                         for v in ("0.19", "0.6", "0.5"))
    own = lambda r: r.rows[r.this_stage].total_bytes  # noqa: E731
    assert own(then) == own(now) > own(legacy)        # v0.5 keeps no prefetch bucket
