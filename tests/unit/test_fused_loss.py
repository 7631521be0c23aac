"""`[compute] cross_entropy = "fused"`: flash-attn's Triton cross-entropy, llm-foundry's
default loss. One kernel each way over the 16-bit logits, which it keeps instead of fp32
ones; its backward allocates only their 16-bit gradient. What the harness runs for
llm-foundry's rows."""

from __future__ import annotations

import pytest

from sim.analytic import activations as act
from sim.analytic.kernels import KernelStyle, cross_entropy
from sim.cli import main
from sim.core.enums import LossImpl
from sim.inputs.load import load_scenario
from sim.results.memory_report import scenario_report
from sim.simulate import simulate
from sim.studies.published import row_from_fields, simple_fields

SCENARIO = """
model = "llama3-8b"
cluster = "dgx-h100"
nodes = 1
[training]
seq_len = 2048
micro_batch = 8
global_batch = 64
precision = "bf16"
[fsdp]
[compute]
cross_entropy = "{loss}"
"""


def test_the_fused_loss_is_one_pass_each_way_over_the_16_bit_logits():
    tokens, vocab = 8192, 128256
    fused = cross_entropy("loss", tokens, vocab, KernelStyle.TORCH, 2, fused=True)
    native = cross_entropy("loss", tokens, vocab, KernelStyle.TORCH, 2)
    assert len(fused.forward) == len(fused.backward_input) == 1
    assert sum(k.bytes for k in fused.forward) == 2 * tokens * vocab
    assert sum(k.bytes for k in fused.backward_input) == 4 * tokens * vocab
    assert sum(k.bytes for k in native.forward + native.backward_input) > 5 * sum(
        k.bytes for k in fused.forward + fused.backward_input)


def test_the_fused_loss_keeps_16_bit_logits_and_allocates_only_their_gradient(write_scenario):
    s = load_scenario(write_scenario(SCENARIO.format(loss="native")))
    m, t = s.model, s.training
    logits = t.seq_len * t.micro_batch * m.vocab
    native = act.outside_layers_activation_bytes(m, t.seq_len, t.micro_batch)
    fused = act.outside_layers_activation_bytes(m, t.seq_len, t.micro_batch, fused_loss=True)
    assert native - fused == pytest.approx(2 * logits - 4 * t.seq_len * t.micro_batch)
    assert act.loss_backward_transient_bytes(m, t.seq_len, t.micro_batch, fused=True) == 2 * logits
    assert act.loss_backward_transient_bytes(m, t.seq_len, t.micro_batch) == 8 * logits


def test_a_fused_loss_lowers_the_simulated_peak_and_the_step(write_scenario):
    runs = {loss: simulate(load_scenario(write_scenario(SCENARIO.format(loss=loss), name=f"{loss}.toml")))
            for loss in LossImpl}
    peak = {loss: max(p.peak for p in r.engine.pools.values()) for loss, r in runs.items()}
    s = runs[LossImpl.NATIVE].scenario
    logits = s.training.seq_len * s.training.micro_batch * s.model.vocab
    assert peak[LossImpl.NATIVE] - peak[LossImpl.FUSED] >= 6 * logits * 0.9     # 2 kept + 6 transient, less rounding
    assert runs[LossImpl.FUSED].step_time_s < runs[LossImpl.NATIVE].step_time_s
    reports = {loss: scenario_report(r.scenario) for loss, r in runs.items()}
    assert reports[LossImpl.FUSED] != reports[LossImpl.NATIVE]     # the static report reads the same key


def test_an_unknown_loss_is_refused_naming_the_choices(write_scenario, capsys):
    assert main(["run", str(write_scenario(SCENARIO.format(loss="liger")))]) == 2
    err = capsys.readouterr().err
    assert "compute.cross_entropy" in err and "native" in err and "fused" in err


def test_llm_foundry_rows_run_its_default_fused_loss():
    fields = {"source": "LF", "model": "MPT-7B", "gpu": "H100-80GB", "gpus": "8", "gpus_per_node": "ns", "tp": "1",
              "pp": "1", "dp": "8", "fsdp_or_zero": "FSDP1_FULL", "micro_batch": "8",
              "global_batch_tokens": "131072", "seq_len": "2048", "precision": "amp_bf16", "act_ckpt": "none",
              "metric": "throughput", "value": "8000", "unit": "tok/s/GPU"}

    row = row_from_fields(simple_fields(fields, 1))
    assert row.scenario is not None and row.scenario.compute.cross_entropy is LossImpl.FUSED
    assert any("fused cross-entropy" in a for a in row.assumptions)
