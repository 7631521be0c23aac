"""ZeRO-Infinity: optimizer states and parameters swapped to the node's NVMe, sub-group by
sub-group, with and without DeepSpeed's pipelined reads and writes; NVMe capacity checked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sim.cli import main
from sim.core.errors import InputError
from sim.engines.schedule import Copy, CpuStep, Mem, Stream
from sim.inputs.load import scenario_from_table
from sim.simulate import simulate

GB = 1e9
REPO = Path(__file__).resolve().parents[2]


def cluster_file(tmp_path: Path, nvme_tb: float = 30.0) -> str:
    """The catalog's DGX-2 (30 TB of NVMe) with another NVMe capacity."""
    text = (REPO / "hardware" / "dgx2.toml").read_text().replace('gpu = "gpus/v100-sxm-32g.toml"',
                                                                 f'gpu = "{REPO / "hardware" / "gpus" / "v100-sxm-32g.toml"}"')
    text = re.sub(r"(?m)^nvme_TB = .*$", f"nvme_TB = {nvme_tb}", text)
    assert f"nvme_TB = {nvme_tb}" in text
    path = tmp_path / "dgx2-nvme.toml"
    path.write_text(text)
    return str(path)


def table(cluster: str, optimizer: dict | str, param: dict | str = "none", model: str = "llama2-13b") -> dict:
    return {"model": model, "cluster": cluster, "nodes": 1,
            "training": {"seq_len": 2048, "micro_batch": 1, "global_batch": 16, "precision": "fp16",
                         "recompute": "full"},
            "zero": {"stage": 3, "sub_group_size": 100_000_000, "offload_optimizer": optimizer, "offload_param": param}}


def run(t: dict):
    return simulate(scenario_from_table(t, Path("s.toml"), "s"))


NVME = {"device": "nvme", "nvme_path": "/local_nvme"}


def copies(result, stream: Stream) -> list:
    return sorted((sp for sp in result.engine.spans if sp.rank == 0 and isinstance(sp.op, Copy)
                   and sp.op.direction is stream), key=lambda sp: sp.start)


def test_optimizer_on_nvme_swaps_16_bytes_in_and_12_out_per_parameter_per_step(tmp_path):
    r = run(table(cluster_file(tmp_path), NVME))
    nvme = sum(a.nbytes for a in r.schedule.classes[0].host if a.category is Mem.NVME)
    partition = nvme / 16.0
    reads = sum(sp.op.nbytes for sp in copies(r, Stream.NVME_READ))
    writes = sum(sp.op.nbytes for sp in copies(r, Stream.NVME_WRITE))
    assert reads == pytest.approx(16 * partition, rel=1e-6)
    assert writes == pytest.approx(12 * partition + 4 * partition, rel=1e-6)   # states + fp32 gradients
    assert r.fits_nvme and r.step_time_s > run(table(cluster_file(tmp_path), "cpu")).step_time_s


def test_pipelined_reads_and_writes_overlap_the_cpu_adam_of_neighbouring_sub_groups(tmp_path):
    path = cluster_file(tmp_path)
    serial = run(table(path, NVME))
    piped = run(table(path, {**NVME, "pipeline_read": True, "pipeline_write": True}))
    assert piped.step_time_s < serial.step_time_s
    adam = sorted((sp for sp in piped.engine.spans if sp.rank == 0 and isinstance(sp.op, CpuStep) and sp.op.params),
                  key=lambda sp: sp.start)
    reads = [sp for sp in copies(piped, Stream.NVME_READ) if sp.op.phase.value == "step"]
    assert len(adam) == len(reads) >= 2
    assert reads[1].start < adam[0].end          # read-ahead: the next sub-group comes in during this Adam
    s_adam = sorted((sp for sp in serial.engine.spans if sp.rank == 0 and isinstance(sp.op, CpuStep)
                     and sp.op.params), key=lambda sp: sp.start)
    s_reads = [sp for sp in copies(serial, Stream.NVME_READ) if sp.op.phase.value == "step"]
    assert s_reads[1].start >= s_adam[0].end     # without it: one sub-group at a time


def test_parameters_on_nvme_are_read_before_each_gather_and_written_back_after_the_step(tmp_path):
    r = run(table(cluster_file(tmp_path), NVME, NVME))
    names = [sp.op.name for sp in copies(r, Stream.NVME_READ)]
    assert any("parameter partition" in n for n in names)
    assert any("16-bit sub-group" in sp.op.name for sp in copies(r, Stream.NVME_WRITE))
    assert not any("16-bit sub-group" in sp.op.name for sp in copies(r, Stream.H2D))   # no copy back to the GPU
    on_gpu = run(table(cluster_file(tmp_path), "none"))
    assert r.peak_pool().peak <= on_gpu.peak_pool().peak
    buffers = [a for a in r.schedule.classes[0].host if a.label == "pinned parameter swap buffers"]
    assert buffers and buffers[0].nbytes == 5 * 100_000_000 * 2          # buffer_count x buffer_size x 2 B


def test_a_node_whose_nvme_cannot_hold_the_swapped_state_exits_3_with_the_numbers(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(f'model = "llama2-70b"\ncluster = "{cluster_file(tmp_path, nvme_tb=0.5)}"\nnodes = 1\n'
                    '[training]\nseq_len = 2048\nmicro_batch = 1\nglobal_batch = 16\nprecision = "fp16"\n'
                    'recompute = "full"\n[zero]\nstage = 3\n'
                    'offload_optimizer = { device = "nvme", nvme_path = "/local_nvme" }\n'
                    'offload_param = { device = "nvme", nvme_path = "/local_nvme" }\n')
    assert main(["run", str(path)]) == 3
    out = capsys.readouterr().out
    assert "DOES NOT FIT on NVMe" in out and "of 500.0 GB" in out
    assert main(["memory", str(path)]) == 3
    assert "NVMe:" in capsys.readouterr().out


@pytest.mark.parametrize("change, words", [
    ({"cluster": "dgx-a100-80g"}, "nvme_bandwidth_GBps or nvme_TB"),
    ({"zero": {"stage": 2, "offload_optimizer": NVME}}, "needs stage 3"),
    ({"zero": {"stage": 3, "offload_optimizer": {"device": "nvme"}}}, "nvme_path"),
])
def test_nvme_offload_that_cannot_run_is_refused(tmp_path, change, words):
    t = {**table(cluster_file(tmp_path), NVME), **change}
    with pytest.raises(InputError, match=words):
        scenario_from_table(t, Path("s.toml"), "s")


def test_aio_settings_that_keep_too_little_in_flight_slow_the_swaps(tmp_path):
    """DeepSpeed's aio defaults (8 x 1 MiB per rank) fill a DGX-2's NVMe; one 128 KiB request
    per rank keeps 2 MB in flight on the node against the 2.5 MB (25 GB/s x 100 us) that
    would: about half the rate (sim.analytic.opcost.aio_efficiency)."""
    from sim.analytic.opcost import aio_efficiency
    from sim.core.specs import AioConfig
    path = cluster_file(tmp_path)
    c = scenario_from_table(table(path, NVME), Path("s.toml"), "s").cluster
    assert aio_efficiency(AioConfig(), c, 16) == pytest.approx(1.0)
    small = aio_efficiency(AioConfig(block_size=131072, queue_depth=1), c, 16)
    assert small == pytest.approx(0.47, abs=0.02)
    depths = [aio_efficiency(AioConfig(block_size=131072, queue_depth=q), c, 16) for q in (1, 2, 4, 8)]
    assert depths == sorted(depths) and aio_efficiency(AioConfig(overlap_events=False), c, 16) < 1.0
    base = run(table(path, NVME))
    slow = run({**table(path, NVME), "aio": {"block_size": 131072, "queue_depth": 1}})
    assert slow.step_time_s > 1.2 * base.step_time_s
    reads = lambda r: sum(sp.end - sp.start for sp in copies(r, Stream.NVME_READ))  # noqa: E731
    assert reads(slow) == pytest.approx(reads(base) / small, rel=0.05)


@pytest.mark.parametrize("aio, words", [
    ({"single_submit": True}, "not simulated yet"),
    ({"use_gds": True}, "not simulated yet"),
    ({"queue_depth": 0}, "aio.queue_depth"),
    ({"thread_count": 2, "intra_op_parallelism": 2}, "aio.thread_count"),
])
def test_aio_settings_that_are_not_simulated_or_wrong_are_refused(tmp_path, aio, words):
    with pytest.raises(InputError, match=re.escape(words)):
        scenario_from_table({**table(cluster_file(tmp_path), NVME), "aio": aio}, Path("s.toml"), "s")


def test_aio_needs_deepspeed_and_one_place(tmp_path):
    t = {**table(cluster_file(tmp_path), NVME), "aio": {"queue_depth": 4}}
    assert scenario_from_table(t, Path("s.toml"), "s").zero.aio.queue_depth == 4
    ddp = {k: v for k, v in t.items() if k != "zero"} | {"engine": "ddp"}
    with pytest.raises(InputError, match="need the DeepSpeed engine"):
        scenario_from_table(ddp, Path("s.toml"), "s")
    ds = tmp_path / "ds.json"
    ds.write_text('{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 16, "fp16": {"enabled": true},'
                  ' "zero_optimization": {"stage": 3}, "aio": {"block_size": 262144, "queue_depth": 32}}')
    from_ds = {k: v for k, v in t.items() if k not in ("zero", "aio")} | {"deepspeed": str(ds)}
    from_ds["training"] = {k: v for k, v in t["training"].items() if k not in ("micro_batch", "global_batch")}
    s = scenario_from_table(from_ds, Path("s.toml"), "s")
    assert (s.zero.aio.block_size, s.zero.aio.queue_depth) == (262144, 32)
    with pytest.raises(InputError, match="given in the scenario and in its deepspeed config"):
        scenario_from_table({**from_ds, "aio": {"queue_depth": 4}}, Path("s.toml"), "s")
