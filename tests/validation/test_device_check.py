"""The issue's device check (sim.validate.device_check) at its CPU sizes: every section
runs and yields rates a report can use; the FLOP counts it divides by are the kernel model's."""

from __future__ import annotations

import pytest

from sim.validate import device_check as dc


@pytest.fixture(scope="module")
def checked():
    return dc.device_check("cpu", quick=True)


def test_every_section_measures(checked):
    assert [r["label"] for r in checked["gemm"]][:2] == ["issue", "issue"]
    assert all(r["flops"] > 0 and r["seconds"] > 0 for r in checked["gemm"])
    assert checked["sustained"] and all(w["flops"] > 0 for w in checked["sustained"])
    math_rows = [r for r in checked["attention"] if r["backend"] == "math"]
    assert [r["seq"] for r in math_rows] == [64, 128] and all(r["forward_flops"] > 0 for r in math_rows)
    assert set(checked["memory"]) == {"copy_Bps", "add_Bps", "layernorm_Bps"}
    assert all(v > 0 for v in checked["memory"].values())
    assert 0 < checked["launch"]["eager_s"] < 1e-3 and "graph_s" not in checked["launch"]   # no graphs on a CPU
    steps = checked["steps"]
    assert steps["plain_s"] > 0 and steps["fsdp2_s"] > 0, steps     # FSDP2 on a one-process gloo group
    assert "deepspeed_zero3_s" not in steps                          # not asked for at quick sizes
    assert checked["errors"] == {}


def test_a_failing_section_is_recorded_and_the_rest_still_run(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no such kernel here")
    monkeypatch.setattr(dc, "memory_bound", broken)
    saved = []
    r = dc.device_check("cpu", quick=True, save=lambda partial: saved.append(sorted(partial)))
    assert r["errors"] == {"memory": "RuntimeError: no such kernel here"} and "memory" not in r
    assert len(saved) == 6 and "gemm" in saved[0] and "launch" not in saved[0]   # saved after each section
    assert r["launch"]["eager_s"] > 0 and r["steps"]["plain_s"] > 0
    assert "memory failed: RuntimeError: no such kernel here" in dc.summary_lines(r)


def test_summary_names_each_section(checked):
    text = "\n".join(dc.summary_lines(checked))
    for words in ("GEMM issue", "sustained GEMM over", "attention math seq 128", "memory-bound: copy",
                  "per tiny kernel: eager", "step, 2 layers x 64, 2 x 32 tokens: plain"):
        assert words in text


def test_the_issue_shapes_and_the_model_gemms():
    assert dc.ISSUE_SHAPES == [(8192, 8192, 8192), (512, 4096, 4096)]
    shapes = {label: (m, k, n) for label, m, k, n in dc.model_shapes()}
    assert shapes["MPT-13B mb2 up"] == (4096, 5120, 20480) and shapes["Llama-3.1-8B mb2 down"] == (16384, 14336, 4096)


def test_attention_flops_are_the_causal_half():
    forward, backward = dc.attention_flops(batch_heads=2, seq=1024, head_dim=128)
    assert forward == 2 * 2 * (2 * 1024 * 1024 * 128) / 2      # QK^T and PV, half under the mask
    assert backward == 2.5 * forward


def test_report_compares_each_section_with_the_model(checked, tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path
    path = tmp_path / "device-check-cpu.json"
    path.write_text(json.dumps(checked))
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, str(root / "bench" / "device_report.py"), str(path)],
                         capture_output=True, text=True, cwd=root, timeout=120)
    assert run.returncode == 0, run.stderr
    for words in ("against dgx-h100 (H100-SXM5-80GB)", "GEMMs: median |error|", "sustained GEMM, ",
                  "memory-bound: copy", "per tiny kernel: eager", "steps (zerosim run on one GPU of dgx-h100;",
                  "us_per_hook_at_most"):
        assert words in run.stdout, run.stdout
    assert "fsdp2" in run.stdout.split("steps (zerosim run")[1]     # the FSDP2 step, measured and simulated


def test_calibrate_check_writes_both_files_and_a_summary(monkeypatch, capfd, tmp_path):
    """The command's plumbing (`zerosim calibrate --device cpu --check`): the plain device
    measurement (its CPU GEMMs cut to one small shape here: they take minutes at their
    Llama-70B sizes), then the check at its CPU sizes, each into its JSON."""
    import json

    from sim import cli
    from sim.validate import measure
    real = measure.measure_device
    monkeypatch.setattr(measure, "measure_device", lambda device, shapes, peak, deepspeed_adam: real(
        device, [(64, 64, 64)], peak, adam_params=2**16, deepspeed_adam=deepspeed_adam))
    rc = cli.main(["calibrate", "--device", "cpu", "--check", "--sustain-s", "1", "--out", str(tmp_path),
                   "--log", str(tmp_path / "log.txt")])
    out = capfd.readouterr().out      # the command's lines go to the terminal's descriptor
    assert rc == 0, out
    check = json.loads((tmp_path / "device-check-cpu.json").read_text())
    assert check["errors"] == {} and list(check)[-1] == "attention"           # attention last
    plain = json.loads((tmp_path / "device-cpu.json").read_text())
    assert plain["adam"]["deepspeed_cpu_adam"] == "not measured: not asked for"   # no JIT build with --check
    assert "GEMM issue [128, 128, 128]" in out and f"device check: {tmp_path / 'device-check-cpu.json'}" in out
