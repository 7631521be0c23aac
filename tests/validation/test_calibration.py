"""Calibration: the alpha-beta fit, and a short real measurement that yields a usable profile."""

from __future__ import annotations

import pytest

from sim.analytic import opcost
from sim.analytic.opcost import bus_factor, ring_steps
from sim.core.enums import Coll
from sim.inputs.hardware import load_cluster
from sim.simulate import simulate
from sim.validate.calibrate import calibrate, fit_alpha_beta
from sim.validate.compare import validation_scenario
from sim.validate.measure_memory import memory_efficiency

SMALL = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 128, "vocab": 256}


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "broadcast"])
def test_fit_recovers_alpha_and_busbw(op):
    alpha, busbw = 40e-6, 2.5e9
    samples = [(n, s, ring_steps(Coll(op), n) * alpha + s * bus_factor(Coll(op), n) / busbw)
               for n in (2, 4) for s in (2**10, 2**14, 2**18, 2**22)]
    got = fit_alpha_beta(samples, op)
    assert got == pytest.approx((alpha, busbw), rel=1e-6)


def test_fit_holds_small_messages_when_the_largest_is_off():
    # 10% of noise on the 64 MiB point alone (one slow round on a shared machine) must not
    # move the latency of 1 KiB .. 64 KiB collectives: an unweighted fit put them 32% fast
    op, alpha, busbw, n = "all_gather", 400e-6, 0.45e9, 4
    sizes = [2**10 * 4**i for i in range(9)]

    def model(s, a, bw):
        return ring_steps(Coll(op), n) * a + s * bus_factor(Coll(op), n) / bw

    samples = [(n, s, model(s, alpha, busbw) * (1.10 if s == sizes[-1] else 1.0)) for s in sizes]
    got = fit_alpha_beta(samples, op)
    for s in sizes[:4]:
        assert model(s, *got) == pytest.approx(model(s, alpha, busbw), rel=0.01)


def test_a_short_calibration_writes_a_profile_the_simulator_uses(tmp_path):
    # FSDP2's hooks only: DeepSpeed's engine takes longer to start than the rest of the calibration
    results = calibrate(tmp_path, worlds=(2,), sizes=(2**10, 2**14, 2**18), model=SMALL, tokens=64, hooks=("fsdp2",),
                        seq_len=32)
    path = results[2]["path"]
    cluster = load_cluster(path)
    # the measured curves, not the fitted lines, are the profile's collectives
    assert set(cluster.calibration_curves) == {"all_reduce", "all_gather", "reduce_scatter", "broadcast"}
    assert cluster.calibration == {}
    for op, samples in results[2]["samples"].items():
        for n, size, t in samples:
            phases = opcost.collective_phases(Coll(op), size, opcost.GroupShape(n, 1, n), cluster)
            assert opcost.isolated_time(phases, cluster) == pytest.approx(t, rel=1e-4)
    assert cluster.gpu.fp32_flops > 1e8 and cluster.gpus_per_node == 2
    host = cluster.node.host
    assert host.synchronous and host.launch == 0.0 and host.fsdp2_hook > 0.0   # a CPU process: hooks inline
    assert 0.0 <= cluster.gpu.comm_interference <= 9.0       # compute at 1 / (1 + c) of its rate: at least a tenth
    assert 0.0 < cluster.gpu.attention_efficiency <= 1.0 and 0.0 < cluster.gpu.attention_backward_efficiency <= 1.0
    assert 0.0 < host.zero3_rank_piece < 1e-3        # seconds per (rank, tensor) slice
    kernels = results[2]["compute"]["memory_kernels"]
    assert set(kernels["cases"]) == {"norm", "activation", "residual", "rotary", "loss", "adam"}
    assert all(seconds > 0 and nbytes > 0 and count > 0 for seconds, nbytes, count in kernels["cases"].values())
    assert cluster.gpu.memory_bandwidth_efficiency == pytest.approx(results[2]["compute"]["memory_efficiency"], rel=1e-3)
    assert 0.05 <= cluster.gpu.memory_bandwidth_efficiency <= 1.0
    assert results[2]["hooks"]["fsdp2"] == pytest.approx(host.fsdp2_hook, rel=1e-4)
    s = validation_scenario("ddp", SMALL, 2, seq_len=32, micro_batch=2, grad_accum=1, cluster=str(path))
    assert simulate(s).step_time_s > 0


def test_memory_efficiency_is_counted_bytes_over_the_rate_and_the_busy_time():
    totals = {"seconds": 0.011, "bytes": 1e9, "kernels": 1000}
    # 1 GB at 200 GB/s is 5 ms; 11 ms measured less 1000 kernels x 1 us leaves 10 ms busy
    assert memory_efficiency(totals, 200e9, 1e-6) == pytest.approx(0.5)
    assert memory_efficiency(totals, 200e9, 20e-6) == 1.0          # overheads explain it all
    assert memory_efficiency({**totals, "seconds": 100.0}, 200e9, 0.0) == 0.05   # floor


def test_device_measurement_on_cpu():
    from sim.validate.measure import measure_device
    # without DeepSpeedCPUAdam (its first use builds a C++ op: about a minute on 2 cores)
    r = measure_device("cpu", [(64, 64, 64)], peak_flops=1e12, adam_params=2**18, deepspeed_adam=False)
    assert r["gemm"][0]["flops"] > 0 and 0 < r["gemm"][0]["efficiency"] < 1
    assert r["copies"] == {} and r["adam"]["torch_adam_params_per_s"] > 0
