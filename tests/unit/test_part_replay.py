"""Identical micro-steps are planned once and replayed (sim.engines.builder): the schedule is
the same, op by op, as when every part is planned afresh, for every strategy, with and
without pipelining, and replays do happen where the planner promises identical parts."""

from __future__ import annotations

import pytest

from sim.engines.plan import layout_of, planner_for
from sim.engines.schedule import ClassSchedule
from tests.crosscheck.scenarios import STRATEGIES, tiny

PIPELINED = {"ds-zero1-pp4": {"zero": {"stage": 1}, "parallel": {"pp": 4}},
             "ds-zero1-tp2-pp2": STRATEGIES["ds-zero1-tp2-pp2"],
             "ddp-pp2": {"engine": "ddp", "parallel": {"pp": 2}},
             "ds-zero1-overlap-pp2": {"zero": {"stage": 1, "overlap_comm": True}, "parallel": {"pp": 2}}}


def classes(s, *, replay: bool) -> list[ClassSchedule]:
    layout, out = layout_of(s), []
    for stage in range(layout.pp):
        planner = planner_for(s, layout, stage)
        planner.b.replays = replay
        out.append(planner.build().classes[0])
    return out


def scenario(name: str, grad_accum: int, nodes: int = 1):
    table = PIPELINED.get(name) or STRATEGIES[name]
    return tiny(name, nodes=nodes, grad_accum=grad_accum, strategy_table=table)


@pytest.mark.parametrize("name", sorted(STRATEGIES) + sorted(PIPELINED))
@pytest.mark.parametrize("grad_accum", [1, 5])
def test_replayed_parts_plan_the_same_ops(name, grad_accum):
    try:
        s = scenario(name, grad_accum, nodes=2)
    except Exception as e:       # a layout the strategy refuses (e.g. FSDP2 with pipelining)
        pytest.skip(str(e))
    for fresh, replayed in zip(classes(s, replay=False), classes(s, replay=True), strict=True):
        assert list(fresh.streams) == list(replayed.streams)
        for stream in fresh.streams:
            assert fresh.streams[stream] == replayed.streams[stream], stream
        assert fresh.resident == replayed.resident and fresh.host == replayed.host


@pytest.mark.parametrize("name", ["ds-zero1-pp4", "ddp-pp2", "ds-zero1"])
def test_identical_micro_steps_are_replayed(name):
    s = scenario(name, grad_accum=8)
    planner = planner_for(s, layout_of(s), 0)
    planner.build()
    assert planner.b.replayed >= 2 * (8 - 3)     # all but the first and last micro-steps, both parts


# -- the builder's rules, one by one ---------------------------------------------------------
from sim.analytic.kernels import gemm  # noqa: E402
from sim.engines.builder import Builder  # noqa: E402
from sim.engines.schedule import Alloc, Direction, Mem, Phase, PipeTag, Stream  # noqa: E402

ACT = Alloc(Mem.ACTIVATIONS, "activations", 1.0)


def kernel(b: Builder, name: str, **kw):
    return b.compute(f"fwd {name}", kw.pop("phase", Phase.FWD), kw.pop("ms", 0), kernels=(gemm(name, 8, 8, 8),),
                     join=True, **kw)


def test_a_quiet_kernel_joins_the_op_before_it():
    b = Builder()
    first = kernel(b, "m.layers.0.attn", layer=0)
    assert kernel(b, "m.layers.0.mlp", layer=0) == first
    (op,) = b.finish().streams[Stream.COMPUTE]
    assert [k.name for k in op.kernels] == ["m.layers.0.attn", "m.layers.0.mlp"]
    assert op.module_ops() == ("fwd m.layers.0.attn", "fwd m.layers.0.mlp")
    assert op.name == "fwd m.layers.0" and op.flops == 2 * 2 * 8**3


@pytest.mark.parametrize("between", ["host sync", "frees", "allocates", "other phase", "other layer",
                                     "stream wait", "receive", "new part", "explicit dependency"])
def test_a_kernel_does_not_join_when_the_boundary_is_observable(between):
    b = Builder()
    first = kernel(b, "a", layer=0, free=(ACT,) if between == "frees" else ())
    kw: dict = {"layer": 0}
    if between == "host sync":
        b.host_sync(first)
    elif between == "allocates":
        kw["alloc"] = (ACT,)
    elif between == "other phase":
        kw["phase"] = Phase.BWD
    elif between == "other layer":
        kw["layer"] = 1
    elif between == "stream wait":
        b.stream_wait(Stream.COMPUTE, first)
    elif between == "receive":
        b.stream_receive(Stream.COMPUTE, PipeTag(Direction.FORWARD, 0))
    elif between == "new part":
        b.begin_part()
    elif between == "explicit dependency":
        kw["deps"] = [first]
    second = kernel(b, "b", **kw)
    assert second != first


def test_replay_renumbers_micro_steps_and_shifts_dependencies():
    b = Builder()
    for ms in range(3):
        if b.replay("part", ms):
            continue
        b.begin_part()
        b.stream_receive(Stream.COMPUTE, PipeTag(Direction.FORWARD, ms))
        a = b.compute("fwd a", Phase.FWD, ms)
        b.send("send", Phase.FWD, ms, nbytes=4.0, tag=PipeTag(Direction.FORWARD, ms), peer=1, deps=[a])
        b.end_part("part", ms)
    assert b.replayed == 2
    b.attach(b.last(Stream.COMPUTE), free=(ACT,))      # a replayed op can still be changed
    cls = b.finish()
    computes, sends = cls.streams[Stream.COMPUTE], cls.streams[Stream.P2P]
    assert [op.micro_step for op in computes] == [0, 1, 2]
    assert [op.waits_for[0].micro_step for op in computes] == [0, 1, 2]
    assert [op.tag.micro_step for op in sends] == [0, 1, 2]
    assert [op.deps for op in sends] == [(c.id,) for c in computes]
    assert computes[-1].free == (ACT,) and computes[0].free == ()


def test_a_part_that_reaches_outside_itself_is_not_replayed():
    b = Builder()
    before = b.compute("fwd setup", Phase.FWD, 0)
    for ms in range(3):
        if b.replay("part", ms):
            continue
        b.begin_part()
        b.compute("fwd a", Phase.FWD, ms, deps=[before])
        b.end_part("part", ms)
    assert b.replayed == 0
