"""FSDP1 (`[fsdp] version = 1`, FullyShardedDataParallel with a FlatParameter per unit): the
same units, all-gathers and reduce-scatters as FSDP2, but the gathered FlatParameter is the
unsharded parameter (no copy-out), autograd flattens the gradients (the copy-in's bytes),
the compute stream never waits for a reduce-scatter, and the optimizer steps one flat
parameter per unit. What it cannot express is refused, never approximated."""

from __future__ import annotations

import pytest

from sim.core.enums import Coll
from sim.core.errors import InputError
from sim.engines.plan import plan
from sim.engines.schedule import Collective, Compute, GpuOptimizer, Stream
from sim.simulate import simulate
from tests.crosscheck.scenarios import tiny


def scenario(version: int, nodes: int = 1, **fsdp):
    return tiny("fsdp2", nodes=nodes, strategy_table={"fsdp": {"version": version, **fsdp}})


def named(s, text: str) -> list:
    return [op for cls in plan(s).classes for op in cls.ops() if isinstance(op, Compute) and text in op.name]


def test_no_copy_out_and_the_gradients_flattened_instead_of_copied_in():
    two, one = scenario(2), scenario(1)
    assert named(two, "all-gather copy-out") and not named(one, "all-gather copy-out")
    copy_in, flatten = named(two, "reduce-scatter copy-in"), named(one, "gradient flatten")
    assert len(flatten) == len(copy_in) > 0
    assert sum(k.bytes for op in flatten for k in op.kernels) == pytest.approx(
        sum(k.bytes for op in copy_in for k in op.kernels))


def test_the_same_collectives_and_a_step_no_longer_than_fsdp2():
    two, one = simulate(scenario(2, nodes=2)), simulate(scenario(1, nodes=2))
    key = lambda r: sorted((row["op"], row["group"], row["count"], row["message_bytes"]) for row in r.comm_table())  # noqa: E731
    assert key(one) == key(two)
    assert one.step_time_s < two.step_time_s


def test_the_optimizer_steps_one_flat_parameter_per_unit():
    s = scenario(1)
    steps = [op for cls in plan(s).classes for op in cls.ops() if isinstance(op, GpuOptimizer)]
    assert steps and all(op.tensors == s.model.layers + 1 for op in steps)    # blocks + root


@pytest.mark.parametrize(("fsdp", "parallel", "key"), [
    ({"reshard_after_forward": 2}, {}, "fsdp.reshard_after_forward"),
    ({"reshard_root": True}, {}, "fsdp.reshard_root"),
    ({"forward_prefetch": 2}, {}, "fsdp.forward_prefetch"),
    ({"backward_prefetch": 2}, {}, "fsdp.backward_prefetch"),
    ({"reshard_after_forward": False}, {"pp": 2}, "parallel.pp"),
])
def test_what_fsdp1_cannot_express_is_refused(fsdp, parallel, key):
    s = tiny("fsdp2", nodes=2, strategy_table={"fsdp": {"version": 1, **fsdp}, "parallel": parallel})
    with pytest.raises(InputError) as e:
        simulate(s)
    assert e.value.key == key and "not simulated yet" in str(e.value)


def test_lora_with_fsdp1_is_refused():
    table = {"fsdp": {"version": 1}, "lora": {"r": 8, "target_modules": ["q_proj"]}}
    with pytest.raises(InputError) as e:
        simulate(tiny("fsdp2", strategy_table=table))
    assert e.value.key == "lora"


def test_an_unknown_version_names_the_allowed_ones():
    with pytest.raises(InputError) as e:
        scenario(3)
    assert e.value.key == "fsdp.version" and "1, 2" in str(e.value)


def test_compute_waits_for_reduce_scatters_only_where_backward_is_finalised():
    """FSDP2 makes each copy-in wait for the previous reduce-scatter (one in flight); FSDP1
    reduce-scatters on its post-backward stream with record_stream, and the compute stream
    waits only in `_post_backward_final_callback` (before the next micro-step or the step)."""
    def waiting(version: int) -> list[str]:
        cls = plan(scenario(version)).classes[0]
        rs = {op.id for op in cls.ops() if isinstance(op, Collective) and op.coll is Coll.REDUCE_SCATTER}
        return [op.name for op in cls.ops() if op.stream is Stream.COMPUTE and not isinstance(op, Collective)
                and rs & set(op.deps)]
    s = scenario(1)
    assert len(waiting(2)) > s.training.grad_accum
    assert len(waiting(1)) == s.training.grad_accum      # the next micro-step's first op, then the step


def issue_order(s) -> tuple[list[str], int]:
    """Micro-step 0's backward op names in issue order, and the top block."""
    cls = plan(s).classes[0]
    ops = [op for op in cls.ops() if op.micro_step == 0 and op.phase.name == "BWD"]
    return [op.name for op in sorted(ops, key=lambda op: op.id)], s.model.layers - 1


def test_backward_post_issues_the_next_gather_after_the_units_backward():
    """BACKWARD_PRE issues block i - 1's all-gather from block i's pre-backward hook, before
    block i's backward; BACKWARD_POST from its post-backward hook (torch _runtime_utils.py
    `_post_backward_reshard`): after block i's backward and before its reduce-scatter."""
    for prefetch, after_backward in (("BACKWARD_PRE", False), ("BACKWARD_POST", True)):
        names, top = issue_order(scenario(1, backward_prefetch=prefetch))
        gather = names.index(f"all-gather block {top - 1}")
        backward = names.index(f"bwd-input model.layers.{top}")
        flatten = names.index(f"gradient flatten unit {top}")     # autograd's, before the hook
        assert names.count(f"all-gather block {top - 1}") == 1
        if after_backward:
            assert backward < flatten < gather, names[:12]
        else:
            assert gather < backward, names[:12]
        assert gather < names.index(f"reduce-scatter block {top}")


def test_backward_post_costs_nothing_while_the_host_runs_ahead():
    """Block i - 1's gather waits for block i + 1's backward either way (the rate limiter,
    or block i + 1's reduce-scatter ahead of it on the group's communicator), and a host
    ahead of the device issues it before the device needs it."""
    def run(prefetch):
        return simulate(tiny("fsdp2", nodes=2, micro_batch=8,
                             strategy_table={"fsdp": {"version": 1, "backward_prefetch": prefetch}}))
    pre, post, none = run("BACKWARD_PRE"), run("BACKWARD_POST"), run(0)
    assert pre.step_time_s == run(1).step_time_s == pytest.approx(post.step_time_s, rel=1e-12)   # the issue order sums apart
    assert none.step_time_s > pre.step_time_s     # no prefetch at all does cost


@pytest.mark.parametrize("value", ["BACKWARD_SIDEWAYS", -1, True, 1.5, ""])
def test_a_bad_backward_prefetch_names_the_allowed_values(value):
    with pytest.raises(InputError) as e:
        scenario(1, backward_prefetch=value)
    assert e.value.key == "fsdp.backward_prefetch"
    assert "allowed: an int >= 0" in str(e.value) and "BACKWARD_POST" in str(e.value)


@pytest.mark.parametrize(("value", "depth", "post"), [("none", 0, False), ("BACKWARD_PRE", 1, False),
                                                      ("backward_post", 1, True), (2, 2, False)])
def test_backward_prefetch_names_in_any_case_and_depths(value, depth, post):
    f = scenario(2 if depth == 2 else 1, backward_prefetch=value).fsdp
    assert (f.backward_prefetch, f.prefetch_post) == (depth, post)


def test_backward_post_is_refused_with_fsdp2():
    with pytest.raises(InputError) as e:
        simulate(scenario(2, backward_prefetch="BACKWARD_POST"))
    assert e.value.key == "fsdp.backward_prefetch" and "FSDP1" in str(e.value)
