"""A synchronous host (a CPU process of the gloo runs: `[host] synchronous`) pays its hook and
launch costs inline on the compute stream, where a GPU's host hides them behind queued work."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.core.errors import InputError
from sim.des.host import host_cost
from sim.engines.plan import plan
from sim.engines.schedule import Stream
from sim.inputs.catalog import catalog_dir
from sim.inputs.hardware import load_cluster
from sim.simulate import simulate
from tests.crosscheck.scenarios import tiny, with_host, without_interference

HOOK = 2e-3


@pytest.mark.parametrize("strategy", ["fsdp2", "ds-zero3"])
def test_synchronous_hooks_add_to_the_step_and_queued_ones_hide(strategy):
    base = with_host(without_interference(tiny(strategy)), launch=0.0, collective_launch=0.0,
                     zero3_hook=0.0, fsdp2_hook=0.0)
    hooked = with_host(base, zero3_hook=HOOK, fsdp2_hook=HOOK)
    total = sum(host_cost(op, hooked.cluster.host, hooked.engine) for op in plan(hooked).ops(0))
    assert total > 0
    plain = simulate(base).step_time_s
    queued = simulate(hooked).step_time_s
    inline = simulate(with_host(hooked, synchronous=True)).step_time_s
    # inline: every hook is on the compute stream's critical path (communication may still
    # hide behind it, so the step grows by at least the compute-bound part of them)
    assert inline >= plain + 0.9 * total
    assert queued < inline


def test_the_local_cpu_profile_is_synchronous_and_gpu_clusters_are_not():
    assert load_cluster(catalog_dir("hardware") / "local-cpu.toml").node.host.synchronous
    assert not load_cluster(catalog_dir("hardware") / "dgx-a100-80g.toml").node.host.synchronous


def test_synchronous_must_be_a_boolean(tmp_path):
    text = (catalog_dir("hardware") / "local-cpu.toml").read_text().replace("synchronous = true", 'synchronous = "yes"')
    (tmp_path / "gpus").mkdir()
    (tmp_path / "gpus" / "cpu-process.toml").write_text((catalog_dir("hardware") / "gpus" / "cpu-process.toml").read_text())
    (tmp_path / "c.toml").write_text(text)
    with pytest.raises(InputError) as e:
        load_cluster(tmp_path / "c.toml")
    assert "host.synchronous" in str(e.value) and "boolean" in str(e.value)


def _overlap_s(s) -> float:
    """Seconds that one rank's FSDP collectives run beside its compute, over the last step."""
    result = simulate(s)
    rank = result.layout.representatives[0]
    spans = [sp for sp in result.engine.spans if sp.rank == rank and sp.step == result.steps - 1]
    compute = [(sp.start, sp.end) for sp in spans if sp.op.stream is Stream.COMPUTE]
    comms = [(sp.start, sp.end) for sp in spans if sp.op.stream in (Stream.ALLGATHER, Stream.REDUCE)]
    assert comms
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in comms for s2, e2 in compute)


@pytest.mark.parametrize("version", [2, 1])
def test_fsdp_collectives_block_a_synchronous_host(version):
    """FSDP calls its all-gathers and reduce-scatters without async_op: with gloo on a CPU
    process the calling thread waits for each, so none runs beside compute, while on a GPU
    the host returns at once and prefetched gathers overlap the blocks' compute."""
    s = tiny("fsdp2")
    s = replace(s, fsdp=replace(s.fsdp, version=version))
    assert _overlap_s(s) > 0
    blocking = with_host(s, synchronous=True)
    assert _overlap_s(blocking) == 0.0
    assert simulate(blocking).breakdown.exposed_comm_s > simulate(s).breakdown.exposed_comm_s
