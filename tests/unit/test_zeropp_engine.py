"""ZeRO++ in the ZeRO-3 engine model (sim.engines.zeropp): qwZ, hpZ and qgZ each alone change
only their own traffic and memory; all three cut cross-node traffic to about a quarter."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.core.errors import InputError
from sim.engines.schedule import Collective
from sim.inputs.load import scenario_from_table
from sim.simulate import simulate

GB = 1e9
QWZ = {"zero_quantized_weights": True}
HPZ = {"zero_hpz_partition_size": 8}
QGZ = {"zero_quantized_gradients": True}


def table(zero: dict, nodes: int = 4) -> dict:
    return {"model": "llama2-7b", "cluster": "dgx-h100", "nodes": nodes,
            "training": {"seq_len": 4096, "micro_batch": 1, "global_batch": nodes * 8, "precision": "bf16"},
            "zero": {"stage": 3, **zero}}


def run(zero: dict, nodes: int = 4):
    return simulate(scenario_from_table(table(zero, nodes), Path("s.toml"), "s"))


def by_group(result) -> dict[tuple[str, str], float]:
    """Bytes per rank by (collective, group)."""
    out: dict[tuple[str, str], float] = {}
    for row in result.comm_table():
        key = (row["op"], row["group"])
        out[key] = out.get(key, 0.0) + row["bytes_per_rank"]
    return out


def cross_node_per_node(result) -> float:
    """Bytes that enter one node per step: a collective over the whole data-parallel group
    brings in (N - 1) / N of its buffer, one over one rank per node (qgZ's second hop) that
    much for each of the node's ranks."""
    nodes, per_node = result.scenario.nodes, result.scenario.gpus_per_node
    total = 0.0
    for row in result.comm_table():
        if row["group"] == "dp":
            total += row["message_bytes"] * (nodes - 1) / nodes
        elif row["group"] == "dp_across":
            total += per_node * row["message_bytes"] * (nodes - 1) / nodes
    return total


def resident(result, label: str) -> float:
    return sum(a.nbytes for a in result.schedule.classes[0].resident if a.label.startswith(label))


def test_all_three_cut_cross_node_traffic_to_about_a_quarter():
    base, plus = run({}), run({**QWZ, **HPZ, **QGZ})
    assert cross_node_per_node(plus) / cross_node_per_node(base) == pytest.approx(0.25, abs=0.03)


def test_qwz_alone_halves_the_gathers_and_nothing_else():
    base, q = by_group(run({})), by_group(run(QWZ))
    assert q[("all_gather", "dp")] / base[("all_gather", "dp")] == pytest.approx(0.5, abs=0.01)
    assert q[("reduce_scatter", "dp")] == base[("reduce_scatter", "dp")]
    assert set(q) == set(base)
    assert resident(run(QWZ), "hpZ") == 0.0


def gathers(result, phase: str, axis: str) -> float:
    return sum(op.nbytes for op in result.schedule.ops() if isinstance(op, Collective)
               and op.coll.value == "all_gather" and op.phase.value == phase and op.axis.value == axis)


def test_hpz_alone_moves_the_backward_gathers_into_the_node_and_holds_a_secondary_partition():
    base_r, h_r = run({}), run(HPZ)
    base, h = by_group(base_r), by_group(h_r)
    # a module's first gather (the forward) still crosses nodes; later ones gather inside the node
    assert gathers(h_r, "fwd", "dp") / GB == pytest.approx(2 * 6.738, rel=1e-3)   # each module once, 16-bit
    assert gathers(h_r, "bwd", "dp") == 0.0
    everything = [sum(gathers(r, phase, axis) for phase in ("fwd", "bwd") for axis in ("dp", "dp_node"))
                  for r in (base_r, h_r)]
    assert everything[1] == pytest.approx(everything[0], rel=1e-9)    # the same gathers, other groups
    assert h[("all_gather", "dp_node")] < base[("all_gather", "dp")]
    assert h[("reduce_scatter", "dp")] == base[("reduce_scatter", "dp")]
    secondary = resident(h_r, "hpZ secondary partition")
    assert secondary / GB == pytest.approx(2 * 6.74e9 / 8 / GB, rel=0.01)        # 2 Psi / hpz
    assert h_r.peak_pool().peak == pytest.approx(base_r.peak_pool().peak + secondary, rel=1e-3)


def test_qgz_alone_turns_the_reduce_scatter_into_two_int4_all_to_alls():
    base, g = by_group(run({})), by_group(run(QGZ))
    assert g[("all_gather", "dp")] == base[("all_gather", "dp")]
    assert g[("reduce_scatter", "dp")] < 1e-3 * base[("reduce_scatter", "dp")]   # 1-D tensors only
    # int4 (+ scales) of every 2-D gradient inside the node, then 1/8 of it across the 4 nodes
    inside, across = g[("all_to_all", "dp_node")], g[("all_to_all", "dp_across")]
    assert inside == pytest.approx(6.74e9 * 0.502 * 7 / 8, rel=0.01)
    assert across == pytest.approx(inside / 8 * (3 / 4) / (7 / 8), rel=0.01)
    assert resident(run(QGZ), "hpZ") == 0.0


def test_with_gradient_accumulation_hpz_gathers_later_forwards_inside_the_node():
    t = table(HPZ)
    t["training"]["global_batch"] *= 2          # two micro-steps
    r = simulate(scenario_from_table(t, Path("s.toml"), "s"))
    fwd_node = sum(op.nbytes for op in r.schedule.ops() if isinstance(op, Collective) and op.phase.value == "fwd"
                   and op.axis.value == "dp_node" and op.micro_step == 1)
    assert fwd_node > 0.9 * gathers(r, "fwd", "dp")     # micro-step 1's forward: from the secondary partition


def test_on_one_node_qgz_falls_back_to_the_reduce_scatter():
    one, base = by_group(run({**HPZ, **QGZ}, nodes=1)), by_group(run({}, nodes=1))
    assert not any(op == "all_to_all" for op, _ in one)         # stage3.py: qgZ needs more than one node
    assert one[("reduce_scatter", "dp")] == base[("reduce_scatter", "dp")]


@pytest.mark.parametrize("zero, words", [
    ({"stage": 2, **QWZ}, "needs stage 3"),
    ({"stage": 2, **HPZ}, "needs stage 3"),
    ({**HPZ, "zero_hpz_partition_size": 4}, "not simulated yet"),
    ({**HPZ, "zero_hpz_partition_size": 3}, "does not divide"),
])
def test_zeropp_settings_that_deepspeed_rejects_or_that_are_not_simulated_are_refused(zero, words):
    with pytest.raises(InputError, match=words):
        scenario_from_table(table(zero), Path("s.toml"), "s")


def test_qgz_reduce_scatters_every_1d_gradient_and_quantizes_every_2d_one():
    """GPT-2 XL's biases are 1-D however long (the MLP's is 4 h): qgZ leaves them, and only
    them, to the reduce-scatter, by their shapes (DeepSpeed: `len(param.ds_shape) == 1`)."""
    from sim.core.model import module_tree
    t = {**table(QGZ, nodes=2), "model": "gpt2-xl"}
    t["training"] = {**t["training"], "seq_len": 1024}
    r = simulate(scenario_from_table(t, Path("s.toml"), "s"))
    tensors = [x for mod in module_tree(r.scenario.model) for x in mod.tensors]
    flat = [x.numel for x in tensors if len(x.shape) == 1]
    assert max(flat) == 4 * r.scenario.model.hidden          # the MLP's input bias
    dp = 16
    padded = sum(-(-n // dp) * dp for n in flat)
    g = by_group(r)
    assert g[("reduce_scatter", "dp")] == pytest.approx(2 * padded * (dp - 1) / dp, rel=1e-6)
    matrices = sum(x.numel for x in tensors if len(x.shape) > 1)
    assert g[("all_to_all", "dp_node")] == pytest.approx(matrices * 0.502 * 7 / 8, rel=0.01)
