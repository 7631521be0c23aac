"""The validation runner fails fast and clearly: options checked before any run, a deadline
on every torch run (never retried), stale DeepSpeed build locks refused, output in a log.

Only two tests start torch processes (about 3 s each on 2 cores); the rest run none.
"""

from __future__ import annotations

import importlib.util
import os
import time

import pytest

from sim.cli import main
from sim.core.errors import InputError
from sim.validate import build_locks
from sim.validate.build_locks import check_build_locks, stale_build_locks
from sim.validate.torch_runs import RunTimeout, _timeout_message, spawn


def _error_line(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(("argv", "flag", "words"), [
    (["calibrate", "--worlds", "2", "9"], "--worlds", "got 9; allowed: 2 to 8 processes (gloo"),
    (["calibrate", "--worlds", "1"], "--worlds", "got 1"),
    (["calibrate", "--max-size-MiB", "0"], "--max-size-MiB", "got 0"),
    (["calibrate", "--max-size-MiB", "nan"], "--max-size-MiB", "got nan"),
    (["calibrate", "--max-size-MiB", "2048"], "--max-size-MiB", "to 1024"),
    (["calibrate", "--device", "tpu"], "--device", "allowed: cpu, cuda, cuda:N"),
    (["calibrate", "--device", "cuda:-1"], "--device", "allowed: cpu, cuda, cuda:N"),
    (["calibrate", "--peak-TFLOPS", "100"], "--peak-TFLOPS", "only with --device"),
    (["calibrate", "--device", "cpu", "--peak-TFLOPS", "inf"], "--peak-TFLOPS", "finite number > 0"),
    (["calibrate", "--device", "cpu", "--peak-TFLOPS", "-1"], "--peak-TFLOPS", "got -1"),
    (["calibrate", "--check"], "--check", "only with --device"),
    (["calibrate", "--device", "cpu", "--check", "--sustain-s", "0"], "--sustain-s", "allowed: 1 to 120"),
    (["calibrate", "--device", "cpu", "--check", "--sustain-s", "nan"], "--sustain-s", "got nan"),
    (["calibrate", "--timeout", "0"], "--timeout", "finite number > 0"),
    (["validate", "--worlds", "16"], "--worlds", "got 16; allowed: 2 to 8"),
    (["validate", "--timeout", "-5"], "--timeout", "got -5"),
    (["validate", "--log", "x.log", "--verbose"], "--log", "not with --verbose"),
])
def test_bad_options_are_refused_before_any_run(capsys, argv, flag, words):
    start = time.perf_counter()
    err = _error_line(capsys, argv)
    assert f"command line: {flag}: " in err and words in err
    assert time.perf_counter() - start < 5   # no torch run started


def test_cuda_refused_where_torch_has_no_cuda(capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    err = _error_line(capsys, ["calibrate", "--device", "cuda"])
    assert "--device: got 'cuda', but torch sees no CUDA device here" in err


def test_out_and_log_must_be_usable_folders(capsys, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    assert "a-file is a file" in _error_line(capsys, ["calibrate", "--out", str(a_file)])
    assert "cannot create" in _error_line(capsys, ["calibrate", "--out", str(a_file / "sub")])
    assert "a folder; allowed: a file path" in _error_line(capsys, ["validate", "--log", str(tmp_path)])
    assert "--log: cannot create" in _error_line(capsys, ["validate", "--log", str(a_file / "x.log")])


def test_profile_dir_checked_before_the_runs(capsys, tmp_path):
    err = _error_line(capsys, ["validate", "--profile-dir", str(tmp_path / "missing")])
    assert "--profile-dir" in err and "is not a folder" in err
    err = _error_line(capsys, ["validate", "--worlds", "2", "--profile-dir", str(tmp_path)])
    assert "no profile for 2 processes (local-cpu-calibrated-w2.toml" in err and "zerosim calibrate" in err
    (tmp_path / "local-cpu-calibrated-w2.toml").write_text('name = "x"\ngpu = "missing-gpu.toml"\n')
    err = _error_line(capsys, ["validate", "--worlds", "2", "--profile-dir", str(tmp_path)])
    assert "local-cpu-calibrated-w2.toml" in err   # the profile's own problem, named by file


@pytest.fixture
def extensions(tmp_path, monkeypatch):
    """A TORCH_EXTENSIONS_DIR of our own, with one op build folder."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    (tmp_path / "cpu_adam").mkdir()
    return tmp_path


def test_a_stale_build_lock_is_refused_naming_the_file(extensions, capsys):
    lock = extensions / "cpu_adam" / "lock"
    lock.write_text("")
    with pytest.raises(InputError) as error:
        check_build_locks()
    assert str(lock) in str(error.value) and "waits forever" in str(error.value)
    assert "no process has it open" in str(error.value)
    with pytest.raises(InputError, match="stale build lock"):   # before any process starts
        spawn(2, "train_deepspeed", {"zero": {"stage": 1}})
    if importlib.util.find_spec("deepspeed") is not None:   # validate checks only when it runs DeepSpeed
        err = _error_line(capsys, ["validate", "--worlds", "2"])
        assert f"{lock}: stale build lock" in err


def test_a_lock_held_by_a_running_build_is_not_stale(extensions):
    lock = extensions / "cpu_adam" / "lock"
    fd = os.open(lock, os.O_CREAT | os.O_EXCL)   # as FileBaton.try_acquire: held open during the build
    try:
        assert stale_build_locks() == []
        check_build_locks()
    finally:
        os.close(fd)
    assert [p for p, _ in stale_build_locks()] == [lock]


def test_without_proc_only_old_locks_are_stale(extensions, monkeypatch):
    monkeypatch.setattr(build_locks, "_holders", lambda lock: None)
    lock = extensions / "cpu_adam" / "lock"
    lock.write_text("")
    assert stale_build_locks() == []
    old = time.time() - build_locks.STALE_AFTER_S - 60
    os.utime(lock, (old, old))
    assert stale_build_locks() == [(lock, "it is 11 minutes old")]


def test_timeout_message_names_the_run_and_a_stale_lock(extensions):
    lock = extensions / "cpu_adam" / "lock"
    lock.write_text("")
    text = _timeout_message("train_deepspeed", 4, {"zero": {"stage": 3}}, 300, "/tmp/x.log")
    assert "the train_deepspeed run (world 4, DeepSpeed ZeRO stage 3) did not finish in 300 s" in text
    assert str(lock) in text and "waits forever" in text and "/tmp/x.log" in text
    lock.unlink()
    text = _timeout_message("train_llama", 2, {"strategy": "fsdp2", "hf": True}, 12.5, None)
    assert "(world 2, strategy fsdp2, HF Llama) did not finish in 12.5 s" in text and "--timeout" in text


def test_a_run_past_its_deadline_is_stopped_not_retried(tmp_path):
    start = time.perf_counter()
    with pytest.raises(RunTimeout, match=r"the idle run \(world 2\) did not finish in 2 s"):
        spawn(2, "idle", {"seconds": 120}, timeout_s=2)
    assert time.perf_counter() - start < 30   # one attempt, stopped (SIGTERM, then SIGKILL after 5 s)


def test_a_worker_error_is_not_retried_and_its_output_goes_to_the_log(tmp_path):
    log = tmp_path / "run.log"
    with pytest.raises(Exception, match="boom"):
        spawn(2, "idle", {"raise": "boom"}, log=log)
    text = log.read_text()
    assert text.count("--- the idle run (world 2): rank") == 2   # one attempt: one header per rank
    assert "written at the C level" in text


def test_quiet_output_restores_the_terminal(tmp_path, capfd):
    from sim.validate.output import command_output
    log = tmp_path / "sub" / "x.log"
    with command_output("validate", str(log), verbose=False) as (out, path):
        print("table row", file=out)
        print("library noise")
        os.write(2, b"C-level noise\n")
    captured = capfd.readouterr()
    assert captured.out == f"table row\ntorch / DeepSpeed output: {log}\n" and captured.err == ""
    assert path == log and log.read_text() == "library noise\nC-level noise\n"


def test_a_speed_probe_times_the_gemms_around_the_run():
    ranks = spawn(2, "idle", {"seconds": 0.0, "speed_probe": [(64, 64, 64), (128, 64, 32)]})
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(1e6 < r["probe_flops"] < 1e14 for r in ranks)   # FLOP/s of a CPU core: measured, not set


def test_timing_summary_is_the_median_over_rounds_of_each_strategy():
    from sim.validate.timing import rotated, summarise
    assert rotated(("a", "b", "c"), 1) == ("b", "c", "a") and rotated(("a", "b", "c"), 3) == ("a", "b", "c")
    rows = [{"strategy": "ddp", "world": 2, "measured_s": m, "predicted_s": p, "adjusted_s": a,
             "error": p / m - 1, "adjusted_error": a / m - 1}
            for m, p, a in ((1.0, 1.3, 1.05), (1.0, 0.8, 0.92), (1.0, 1.1, 1.2))]
    (adjusted,) = summarise(rows)
    assert adjusted["median_error"] == pytest.approx(0.05) and adjusted["within"]
    assert (adjusted["min_error"], adjusted["max_error"]) == (pytest.approx(-0.08), pytest.approx(0.2))
    (raw,) = summarise(rows, key="error")
    assert raw["median_error"] == pytest.approx(0.1) and raw["predicted_s"] == pytest.approx(1.1)


def test_each_strategy_is_also_compared_with_ddp_in_the_same_round():
    """The ratio to DDP's step in the same round and world, measured and predicted: a round
    whose machine ran slow for both moves neither ratio."""
    from sim.validate.timing import relative_to

    def row(rnd, strategy, world, measured, adjusted):
        return {"round": rnd, "strategy": strategy, "world": world, "measured_s": measured, "adjusted_s": adjusted}
    rows = [row(0, "ddp", 2, 0.40, 0.44), row(0, "fsdp2", 2, 0.64, 0.57),
            row(1, "ddp", 2, 0.80, 0.88), row(1, "fsdp2", 2, 1.28, 1.14),    # the same round at half the speed
            row(2, "ddp", 2, 0.40, 0.40), row(2, "fsdp2", 2, 0.60, 0.52),
            row(0, "fsdp2", 4, 1.3, 1.2)]                                     # no DDP run at world 4: left out
    (fsdp2,) = relative_to(rows)
    assert (fsdp2["strategy"], fsdp2["world"], fsdp2["rounds"]) == ("fsdp2", 2, 3)
    assert fsdp2["measured_ratio"] == pytest.approx(1.6) and fsdp2["predicted_ratio"] == pytest.approx(0.57 / 0.44)
    assert (fsdp2["measured_low"], fsdp2["measured_high"]) == (pytest.approx(1.5), pytest.approx(1.6))
    assert fsdp2["ratio_error"] == pytest.approx((0.57 / 0.44) / 1.6 - 1)


def test_the_measured_step_leaves_the_warm_up_out():
    """The simulator predicts a steady step: the first two steps (buffers built, allocator
    filled) do not count, and one slow step among the rest moves the median little."""
    from sim.validate.timing import WARMUP_STEPS, steady_step
    steady = [0.50, 0.52, 0.49, 0.51, 0.50, 0.53, 0.50]
    assert steady_step([0.80, 0.60, *steady]) == pytest.approx(0.50)
    assert steady_step([0.80, 0.60, *steady[:-1], 0.90]) == pytest.approx(0.51)   # the next value up
    with pytest.raises(ValueError, match="warm-up"):
        steady_step([0.8] * WARMUP_STEPS)


def test_the_drift_adjustment_moves_the_gemms_and_not_the_collectives():
    """A run's measured GEMM rate is applied to the profile's GEMMs (and attention) only: at
    the profile's own rate the step is unchanged; at twice the rate a GEMM takes half the
    time, a collective the same, so the step shrinks by less than half."""
    from sim.analytic.kernel_time import kernel_time
    from sim.analytic.kernels import KernelKind
    from sim.engines.schedule import Compute
    from sim.simulate import simulate
    from sim.validate.timing import at_gemm_rate, gemm_flops, timing_scenario
    s = timing_scenario("local-cpu", "fsdp2", 2)
    base = simulate(s)
    assert simulate(at_gemm_rate(s, gemm_flops(s))).step_time_s == pytest.approx(base.step_time_s, rel=1e-12)
    fast = at_gemm_rate(s, 2 * gemm_flops(s))
    assert gemm_flops(fast) == pytest.approx(2 * gemm_flops(s))
    ops = [op for stream in base.schedule.classes[0].streams.values() for op in stream]
    gemm = next(k for op in ops if isinstance(op, Compute) for k in op.kernels if k.kind is KernelKind.GEMM)
    precision = s.training.precision.value
    assert kernel_time(gemm, fast.cluster.gpu, precision) < 0.6 * kernel_time(gemm, s.cluster.gpu, precision)
    assert fast.cluster.gpu.memory_bandwidth == s.cluster.gpu.memory_bandwidth
    assert fast.cluster.calibration_curves == s.cluster.calibration_curves
    assert base.step_time_s / 2 < simulate(fast).step_time_s < base.step_time_s
