"""Published measurements -> scenarios with a measured step time (sim.studies.published).

Rows from shared/validation (skipped when that folder is absent) and synthetic rows in the
same formats; only Scenario objects are built, and the DES runs only for rows whose unknown
network may decide their step (sim.studies.published_network) and Megatron rows without a
micro-batch (sim.studies.published_micro)."""

from __future__ import annotations

import csv
import os
from dataclasses import replace
from pathlib import Path

import pytest

from sim.analytic.compute import korthikanti_model_flops, megatron_flops_per_iteration
from sim.core.enums import Engine, Recompute
from sim.core.errors import InputError
from sim.des.engine import Mode
from sim.inputs.models import model_from_table
from sim.simulate import simulate
from sim.studies import published_micro
from sim.studies import published_network as net
from sim.studies.published import read_rows, row_from_fields
from sim.studies.published_cells import Reliability, number, tier
from sim.studies.published_models import padded_vocab
from sim.studies.published_targets import megatron_flops
from tests.conftest import ROOT

COLUMNS = ("id source source_location source_url obtained_via value_kind model params_B layers hidden heads "
           "ffn_hidden seq_len vocab gpu gpus_per_node nodes total_gpus intra_node_bw inter_node_bw framework "
           "zero_stage offload tp pp dp micro_batch global_batch act_ckpt precision other_config metric value "
           "unit other_reported_metrics metric_definition derived caveats confidence").split()
SIMPLE = ("source model gpu gpus gpus_per_node tp pp dp fsdp_or_zero micro_batch global_batch_tokens seq_len "
          "precision act_ckpt metric value unit").split()


def _data_dir() -> Path | None:
    env = os.environ.get("ZEROSIM_PUBLISHED_DIR")
    for d in ([Path(env)] if env else []) + [ROOT.parent / "shared" / "validation", ROOT / "shared" / "validation"]:
        if (d / "published-calibration.csv").is_file():
            return d
    return None


DATA = _data_dir()
needs_data = pytest.mark.skipif(DATA is None, reason="shared/validation/published-calibration.csv not present")

VP001 = dict(zip(COLUMNS, [
    "VP001", "Narayanan et al., Efficient Large-Scale LM Training on GPU Clusters Using Megatron-LM (SC21)",
    "Table 1", "https://arxiv.org/abs/2104.04473", "", "table_exact", "GPT (Megatron)", "1.7", "24", "2304", "24",
    "9216", "2048", "51200", "NVIDIA A100-SXM4-80GB (DGX A100, Selene)", "8", "4", "32", "", "", "Megatron-LM (PTD-P)",
    "none", "none", "1", "1", "32", "not given in table", "512", "yes (full activation recomputation)", "fp16 mixed",
    "", "achieved TFLOP/s per GPU", "137", "TFLOP/s/GPU", "", "Megatron Eq.3: FLOPs/iter = 96*B*s*l*h^2*(...)",
    "implied iteration time = 3.53 s (Eq.3 with V=51200, s=2048)", "", "high"]))


def write_csv(path: Path, columns: list[str], rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)
    return path


@pytest.fixture(scope="module")
def calibration_rows():
    """The calibration table's rows, read once per module (reading simulates the Megatron
    rows' micro-batch candidates: about 20 s)."""
    assert DATA is not None
    return read_rows(DATA / "published-calibration.csv")


@pytest.fixture(scope="module")
def shared_rows(calibration_rows):
    assert DATA is not None
    return {r.id: r for r in [*calibration_rows, *read_rows(DATA / "published-fsdp-offload.csv")]}


# -- the shared tables ---------------------------------------------------------------------------

@needs_data
def test_vp001_is_a_32_gpu_megatron_data_parallel_run_of_3_53_s(shared_rows):
    r = shared_rows["VP001"]
    assert r.usable and r.reason == "" and r.tier == "A" and r.source == "Megatron SC21"
    s = r.scenario
    assert s.world_size == 32 and (s.parallel.tp, s.parallel.pp, s.parallel.dp) == (1, 1, 32)
    assert s.engine is Engine.MEGATRON and s.training.recompute is Recompute.FULL
    assert s.megatron is not None and not s.megatron.distributed_optimizer and not s.megatron.overlap_grad_reduce
    assert s.training.global_batch == 512 and s.training.micro_batch * s.training.grad_accum == 16
    assert r.measured_step_s == pytest.approx(3.53)
    # the micro-batch is not stated: every power of two that divides the 16 sequences per rank
    assert [v.training.micro_batch for v in r.alternatives] == [1, 2, 4, 8]
    assert any(f"micro_batch {s.training.micro_batch} assumed" in a for a in r.assumptions)


@needs_data
def test_an_unstated_micro_batch_is_the_fastest_that_fits(shared_rows):
    """VP054 (32B, tp 8, 48-way data parallel, 4 sequences per rank): at micro-batch 1 the
    fp32 gradient reduce-scatter has a quarter of the backward to hide behind, at 4 all of
    it; the row is predicted at the fastest micro-batch that fits, chosen without the
    published value. VP057 (pp 6): micro-batch 4 does not fit in 80 GB, so it is not a
    candidate."""
    r = shared_rows["VP054"]
    steps = {v.training.micro_batch: simulate(v, steps=1, mode=Mode.REPRESENTATIVE).step_time_s
             for v in r.alternatives}
    assert set(steps) == {1, 2, 4}
    assert r.scenario.training.micro_batch == min(steps, key=steps.__getitem__)
    assert steps[1] > 1.1 * min(steps.values())
    assert [v.training.micro_batch for v in shared_rows["VP057"].alternatives] == [1, 2]
    assert any("4: out of memory" in a for a in shared_rows["VP057"].assumptions)
    assert not shared_rows["VP431"].alternatives          # torchtitan states its batch


def test_micro_batch_candidates_are_powers_of_two_dividing_the_rank_batch():
    assert published_micro.candidates(192, 48) == [1, 2, 4]
    assert published_micro.candidates(2304, 24) == [1, 2, 4, 8]     # 96 per rank, capped at 8
    assert published_micro.candidates(48, 48) == [1]
    assert published_micro.candidates(72, 24) == [1]                 # 3 per rank


@needs_data
def test_megatron_core_rows_take_the_flags_they_name(shared_rows):
    s = shared_rows["VP054"].scenario       # --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap
    assert s.engine is Engine.MEGATRON and s.megatron is not None
    assert s.megatron.distributed_optimizer and s.megatron.overlap_grad_reduce and s.megatron.overlap_param_gather
    assert s.megatron.tp_comm_overlap and s.parallel.sequence_parallel
    assert not any("TP communication" in a for a in shared_rows["VP054"].assumptions)   # simulated, not a gap
    tp1 = shared_rows["VP051"]               # the same flags at tp = 1: nothing to overlap
    assert tp1.usable and not tp1.scenario.megatron.tp_comm_overlap
    assert any("tp = 1" in a for a in tp1.assumptions)


@needs_data
def test_torchtitan_rows_run_its_part_its_selective_policy_and_its_tp_plan(shared_rows):
    one_d, two_d = shared_rows["VP431"].scenario, shared_rows["VP455"].scenario
    for s in (one_d, two_d):
        assert s.cluster.name == "GrandTeton-H100" and s.cluster.gpu.memory_bandwidth == 2.4e12
        assert s.training.optimizer.value == "fused"
    assert one_d.training.recompute is Recompute.SELECTIVE_OP          # selective_ac_option "op"
    assert two_d.training.recompute is Recompute.FULL and two_d.parallel.sequence_parallel   # SequenceParallel norms
    assert not any("simulated as" in a for a in shared_rows["VP431"].assumptions)


@needs_data
def test_float8_rows_run_float8_linears_under_torch_compile(shared_rows):
    """torchtitan's benchmark rows name Float8 and torch.compile; the paper's 2D row (VP455)
    ran the same experiment, which its companion page captions '+ torch.compile + Float8'."""
    for rid in ("VP437", "VP455", "VP459"):
        r = shared_rows[rid]
        assert r.usable, (rid, r.reason)
        assert r.scenario.compute.float8.value == "tensorwise"
        assert r.scenario.compute.kernels.value == "torch-compile"
    assert any("llama3_h100_202412_torchtitan.md" in a for a in shared_rows["VP455"].assumptions)
    assert not any("llama3_h100" in a for a in shared_rows["VP437"].assumptions)   # its own cells say it
    plain = shared_rows["VP452"].scenario                 # the paper's 1D row: eager bf16, as its cells say
    assert plain.compute.float8.value == "none" and plain.compute.kernels.value == "torch"


@needs_data
def test_mt_nlg_rows_give_the_published_iteration_times(shared_rows):
    expected = {2240: 60.1, 2800: 50.2, 3360: 44.4}
    found = [r for r in shared_rows.values() if r.model.startswith("MT-NLG 530B") and r.usable]
    assert found
    for r in found:
        s = r.scenario
        assert r.measured_step_s == pytest.approx(expected[s.world_size])
        assert (s.parallel.tp, s.parallel.pp, s.engine, int(s.zero_stage)) == (8, 35, Engine.DEEPSPEED, 1)
        assert s.model.vocab == padded_vocab(50272, 8) == 51200


@needs_data
def test_every_row_has_a_scenario_and_step_or_a_one_line_reason(shared_rows):
    assert len(shared_rows) > 150
    for r in shared_rows.values():
        if r.reason:
            assert r.scenario is None and "\n" not in r.reason, r.id
        else:
            assert r.scenario is not None and r.measured_step_s is not None and r.measured_step_s > 0, r.id
        assert all(a and "\n" not in a for a in r.assumptions), r.id
        assert r.tier in "ABC"
    usable = [r for r in shared_rows.values() if r.usable]
    assert len(usable) >= 50
    assert {str(r.scenario.engine) for r in usable} >= {"megatron", "deepspeed", "fsdp2"}


@needs_data
def test_reading_is_deterministic(calibration_rows, tmp_path):
    """A second read gives the same rows, each row's reading independent of the others:
    the table less the three rows whose micro-batch search takes seconds (VP007, VP010,
    VP057; four other rows still search theirs) reads as the same rows of the first read."""
    assert DATA is not None
    slow = {"VP007", "VP010", "VP057"}
    with (DATA / "published-calibration.csv").open(newline="") as fh:
        reader = csv.DictReader(fh)
        kept = [row for row in reader if row["id"] not in slow]
        columns = list(reader.fieldnames or ())
    again = read_rows(write_csv(tmp_path / "published-calibration.csv", columns, kept))
    first = [r for r in calibration_rows if r.id not in slow]
    assert again == first and sum(bool(r.alternatives) for r in again) == 4


@needs_data
def test_refusals_are_the_simulators_own_and_non_step_metrics_are_named(shared_rows):
    reasons = [r.reason for r in shared_rows.values()]
    assert any("is not a step time or a throughput" in x for x in reasons)
    fsdp_tp = [r for r in shared_rows.values() if "FSDP2" in r.reason and "not simulated yet" in r.reason]
    assert all(r.reason.startswith(f"published/{r.id}: parallel.pp") for r in fsdp_tp)   # 3D (PP) only
    assert shared_rows["VP455"].usable and shared_rows["VP455"].scenario.parallel.tp > 1   # TorchTitan 2D


# -- FLOP counts ---------------------------------------------------------------------------------

def gpt(layers: int, hidden: int, heads: int, vocab: int, seq: int = 2048):
    return model_from_table({"family": "gpt2", "layers": layers, "hidden": hidden, "heads": heads,
                             "kv_heads": heads, "ffn_hidden": 4 * hidden, "vocab": vocab, "gated_mlp": False,
                             "tied_embeddings": True, "norm": "layernorm", "bias": "all", "position": "learned",
                             "max_positions": seq}, "test")


def test_eq3_reproduces_mt_nlg_125_7_tflops_from_60_1_s():
    m = gpt(105, 20480, 128, 50272)
    assert megatron_flops(m, 1920, 2048) / (60.1 * 2240) / 1e12 == pytest.approx(125.7, abs=0.05)


def test_generalised_count_is_eq3_with_four_passes_and_korthikanti_with_three():
    m = gpt(96, 12288, 96, 51200)
    assert megatron_flops(m, 8, 2048) == pytest.approx(megatron_flops_per_iteration(8, 2048, 96, 12288, 51200), rel=1e-12)
    assert megatron_flops(m, 8, 2048, layer_passes=3) == pytest.approx(
        korthikanti_model_flops(8, 2048, 96, 12288, 51200), rel=1e-12)


def test_tflops_conversion_reproduces_the_derived_iteration_time():
    """VP001 without its derived column: 137 TFLOP/s on 32 GPUs, Eq. 3 with 96 -> 3.53 s."""
    r = row_from_fields({**VP001, "derived": ""})
    assert r.usable and r.measured_step_s == pytest.approx(3.53, rel=0.01)
    assert any("coefficient 96" in a for a in r.assumptions)
    no_recompute = row_from_fields({**VP001, "derived": "", "act_ckpt": "no", "metric_definition": ""})
    assert no_recompute.measured_step_s == pytest.approx(3.53 * 0.75, rel=0.02)


# -- synthetic rows ------------------------------------------------------------------------------

def test_unknown_gpu_gives_a_reason_not_an_exception(tmp_path):
    path = write_csv(tmp_path / "rows.csv", COLUMNS, [{**VP001, "id": "X1", "gpu": "Graphcore IPU-M2000"}])
    (r,) = read_rows(path)
    assert r.scenario is None and "has no catalog cluster" in r.reason
    assert r.measured_step_s == pytest.approx(3.53)


def test_rows_that_state_nothing_or_garbage_never_raise(tmp_path):
    rows = [{"id": "X2"}, {**VP001, "id": "X3", "metric": "max trainable model size", "unit": "B params"},
            {**VP001, "id": "X4", "value": "OOM", "derived": ""}, {**VP001, "id": "X5", "tp": "<=16 (not given)"},
            {**VP001, "id": "X6", "global_batch": "500", "derived": ""}, {**VP001, "id": "X7", "layers": "1e9x"}]
    out = {r.id: r for r in read_rows(write_csv(tmp_path / "rows.csv", COLUMNS, rows))}
    assert all(r.reason and r.scenario is None for r in out.values())
    assert "not a step time" in out["X3"].reason and "not a number" in out["X4"].reason
    assert out["X5"].reason.startswith("tp not given") and "not a multiple" in out["X6"].reason


def test_simulator_refusals_become_the_reason():
    stated = {**VP001, "inter_node_bw": "8x200 Gb/s HDR InfiniBand per node"}
    fsdp_pp = row_from_fields({**stated, "framework": "TorchTitan (FSDP2 + DTensor TP/PP)", "tp": "4", "pp": "2",
                               "dp": "4", "zero_stage": "3 (FSDP2 FSDP 4)", "micro_batch": "2"})
    # torchtitan's PP default (reshard_after_forward false) is simulated, but not GPT-3's tied embeddings
    assert "FSDP2 with PP: reshard_after_forward false" in " ".join(fsdp_pp.assumptions)
    assert fsdp_pp.scenario is None and "tie_word_embeddings" in fsdp_pp.reason and "not simulated yet" in fsdp_pp.reason
    fsdp_tp = row_from_fields({**stated, "framework": "TorchTitan (FSDP2 + DTensor TP)", "tp": "8", "dp": "4",
                               "zero_stage": "3 (FSDP2 FSDP 4)", "micro_batch": "2"})
    assert fsdp_tp.usable and fsdp_tp.scenario.parallel.tp == 8       # 2D: simulated
    nvme = row_from_fields({**VP001, "framework": "DeepSpeed ZeRO-Infinity", "zero_stage": "3",
                            "offload": "params+grads+optimizer to NVMe"})
    assert nvme.scenario is None and "nvme_bandwidth_GBps or nvme_TB" in nvme.reason   # no NVMe figures there


def test_the_simple_fsdp_table(tmp_path):
    rows = [dict(zip(SIMPLE, "LF MPT-70B H100-80GB 64 ns 1 1 64 FSDP1_FULL 8(GA4) 4194304 2048 amp_bf16 full "
                             "throughput 1039 tok/s/GPU".split())),
            dict(zip(SIMPLE, "ZFC Qwen2.5-3B A100-40GB 2 2_used 1 1 2 DS_ZeRO-2+CPU_opt_offload(bound) 4 ns ns "
                             "bf16 ns step_time 2.497 s".split()))]
    lf, zfc = read_rows(write_csv(tmp_path / "simple.csv", SIMPLE, rows))
    assert lf.id == "LF01" and lf.usable and lf.scenario.engine is Engine.FSDP2
    assert (lf.scenario.training.micro_batch, lf.scenario.training.grad_accum, lf.scenario.model.layers) == (8, 4, 80)
    assert lf.measured_step_s == pytest.approx(2048 * 2048 / (1039 * 64))
    assert lf.scenario.fsdp.version == 1 and any("FSDP1" in a for a in lf.assumptions)
    # Composer's FSDP as llm-foundry's benchmarks ran it: "MP Mode DEFAULT", BACKWARD_POST
    assert lf.scenario.fsdp.reduce_dtype == "fp32" and lf.scenario.fsdp.prefetch_post
    assert any("BACKWARD_POST" in a for a in lf.assumptions)
    fms = read_rows(write_csv(tmp_path / "fms.csv", SIMPLE, [dict(zip(SIMPLE, (
        "FMS Llama2-70B A100 128 ns 1 1 128 FSDP_full 6 3145728 4096 bf16? full throughput 380 tok/s/GPU").split()))]))[0]
    assert fms.usable and fms.scenario.fsdp.version == 1     # torch's own FSDP1 defaults (fms-fsdp)
    assert fms.scenario.fsdp.reduce_dtype is None and not fms.scenario.fsdp.prefetch_post
    assert zfc.reason == "seq_len not given" and zfc.measured_step_s == pytest.approx(2.497)


def test_unknown_header_is_an_input_error(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(InputError):
        read_rows(path)


def test_what_a_source_states_elsewhere_joins_other_config_with_its_source():
    from sim.studies.published_context import STATED_ELSEWHERE, with_stated_context
    notes: list[str] = []
    row = {"id": "VP455", "other_config": "2D"}
    read = with_stated_context(row, notes)
    assert read["other_config"] == "2D; " + STATED_ELSEWHERE["VP455"][0] and row["other_config"] == "2D"
    assert len(notes) == 1 and "torchtitan" in notes[0] and "not in the row's cells" in notes[0]
    assert with_stated_context({"id": "VP001", "other_config": ""}, notes) == {"id": "VP001", "other_config": ""}
    assert len(notes) == 1
    assert all(text and len(where) > 40 for text, where in STATED_ELSEWHERE.values())   # every entry cites



def test_a_publication_s_launch_recipe_sets_the_zero_keys_of_its_rows():
    """The DeepSpeed-on-Azure post's rows run with its recipe's ds_config (Megatron-DeepSpeed
    examples_deepspeed/azure): a 9e7 reduce bucket and 3e9 live / reuse elements, where
    DeepSpeed's defaults are 5e8 and 1e9; a row of another source keeps the defaults."""
    from sim.studies.published_context import STATED_BY_SOURCE, with_stated_context
    from sim.studies.published_layout import zero_knobs
    notes: list[str] = []
    row = {"id": "VPX", "source_url": "https://www.deepspeed.ai/2022/07/26/deepspeed-azure.html", "other_config": ""}
    read = with_stated_context(row, notes)
    assert zero_knobs(read["other_config"], "DeepSpeed", 8) == {
        "reduce_bucket_size": 90_000_000, "max_live_parameters": 3_000_000_000, "max_reuse_distance": 3_000_000_000}
    assert len(notes) == 1 and "run-175b.sh" in notes[0]
    other = {"id": "VPY", "source_url": "https://arxiv.org/abs/2104.04473", "other_config": ""}
    assert with_stated_context(other, notes) == other and len(notes) == 1
    assert all(text and len(where) > 40 for text, where in STATED_BY_SOURCE.values())

def test_cells_and_tiers():
    notes: list[str] = []
    assert number("18K (18432)", "hidden", notes) == 18432 and number("4K", "hidden", notes) == 4096
    assert number("<=16 (MP within node)", "tp", notes) is None and number("not given", "tp", notes) is None
    assert number("8 (assumed)", "gpus_per_node", notes) == 8 and any("8 (assumed)" in n for n in notes)
    assert tier(Reliability("high", "table_exact", False)) == "A"
    assert tier(Reliability("medium", "log_exact (2nd-iteration snapshot)", True)) == "A"
    assert tier(Reliability("medium", "plot_readoff_approx (+/-2)", True)) == "B"
    assert tier(Reliability("medium", "table_exact (via secondary)", True)) == "C"
    assert tier(Reliability("low", "text_exact", True)) == "C"


# -- the row's network -----------------------------------------------------------------------

def test_a_stated_network_is_simulated_and_a_presumed_nominal_one_is_the_catalogs():
    bloom = row_from_fields({**VP001, "id": "N1", "inter_node_bw": "4x100 Gb/s Omni-Path per node"})
    c = bloom.scenario.cluster
    assert (c.node.nics_per_node, c.inter_node.bandwidth * 8 / 1e9) == (4, pytest.approx(100))
    assert any("400 Gb/s per node simulated" in a for a in bloom.assumptions)
    nominal = row_from_fields({**VP001, "id": "N2", "inter_node_bw": "not stated (DGX A100: 8x200 Gb/s HDR IB nominal)"})
    assert nominal.scenario.cluster == row_from_fields(VP001).scenario.cluster
    roce = row_from_fields({**VP001, "id": "N3", "inter_node_bw": "2 Tb/s RoCE (as stated)"})
    assert roce.scenario.cluster.node.nics_per_node == 8
    assert roce.scenario.cluster.inter_node.bandwidth == pytest.approx(250e9 / 8)


def test_stated_network_cells():
    assert net.stated_network("8x200 Gb/s HDR InfiniBand per node", 8) == (8, 200.0)
    assert net.stated_network("400 Gb/s per GPU RDMA backend network", 8) == (8, 400.0)
    assert net.stated_network("100 Gbps per node (1 x 100 Gbps IB)", 16) == (1, 100.0)
    assert net.stated_network("200 Gbps per node", 16) == (0, 200.0)
    assert net.stated_network("not stated", 16) is None and net.stated_network("", 8) is None


def test_an_unknown_network_that_decides_the_step_keeps_the_row_out_with_its_bracket():
    """ZeRO-3 of an 18B model at one micro-batch of 2048 tokens per GPU on 4 nodes: its
    gathers and reductions over one NIC per node take several times the step on eight."""
    zero3 = {**VP001, "params_B": "18.4", "layers": "40", "hidden": "6144", "heads": "48", "ffn_hidden": "24576",
             "framework": "DeepSpeed (Megatron-DeepSpeed)", "zero_stage": "3", "micro_batch": "1",
             "global_batch": "32", "derived": "", "metric": "iteration time", "value": "5.0", "unit": "s"}
    unknown = row_from_fields({**zero3, "id": "U1", "inter_node_bw": "not stated"})
    assert unknown.scenario is None and unknown.measured_step_s == pytest.approx(5.0)
    assert unknown.reason.startswith("inter-node network not stated, and it decides the step")
    assert "inside that range" in unknown.reason
    stated = row_from_fields({**zero3, "id": "U2", "inter_node_bw": "8x200 Gb/s HDR InfiniBand per node"})
    assert stated.usable
    assert not net.network_unknown("", replace(stated.scenario, nodes=1))


def test_deepspeed_transformer_and_embedding_partitions_give_the_end_stages_a_block_fewer():
    """BLOOM's Megatron-DeepSpeed runs balance blocks and the two embedding layers over the
    stages ('type:transformer|embedding'): 22 blocks + 2 embeddings on 4 stages is 6 each."""
    row = {**VP001, "layers": "22", "pp": "4", "dp": "8",
           "other_config": "PP partition 'type:transformer|embedding'"}
    split = row_from_fields(row)
    assert split.usable and split.scenario.stages.counts() == (5, 6, 6, 5)
    assert any("5 blocks on the first and last stages" in a for a in split.assumptions)
    unstated = row_from_fields({**row, "other_config": ""})
    assert unstated.scenario is None and "does not divide" in unstated.reason
    uneven = row_from_fields({**row, "layers": "21"})
    assert uneven.scenario is None and "uneven inside the stages" in uneven.reason
    dividing = row_from_fields({**row, "layers": "24"})     # 26 units on 4 stages: 7, 7, 6, 6
    assert dividing.scenario is None and "uneven inside the stages" in dividing.reason


# The engine and release tests below state the network, so that the unknown-network bracket
# (sim.studies.published_network), which depends on the fitted clock, cannot set them aside.
STATED = {**VP001, "inter_node_bw": "8x200 Gb/s HDR InfiniBand per node (one per GPU)"}


def test_bigscience_bf16_optimizer_rows_run_deepspeeds_bf16_optimizer():
    row = row_from_fields({**STATED, "framework": "Megatron-DeepSpeed (BigScience fork)", "zero_stage": "1 (BF16Optimizer)",
                           "precision": "bf16 (fp32 grad accumulation)"})
    assert row.usable and row.scenario.zero.grad_accum_dtype == "fp32" and row.scenario.bf16_optimizer_bytes == 4
    plain = row_from_fields({**STATED, "framework": "Megatron-DeepSpeed (BigScience fork)", "zero_stage": "1",
                             "precision": "bf16"})
    assert plain.usable and plain.scenario.bf16_optimizer_bytes == 0


def test_zero3_rows_run_the_deepspeed_release_of_their_year():
    sc21 = row_from_fields({**STATED, "source": "Narayanan et al. (SC21)", "framework": "DeepSpeed ZeRO-3 (no TP/PP)",
                            "zero_stage": "3", "micro_batch": "1"})
    assert sc21.usable and sc21.scenario.zero.deepspeed_version == "0.5"
    assert any("v0.3.13-v0.5.4" in a for a in sc21.assumptions)
    later = row_from_fields({**STATED, "source": "DeepSpeed Azure blog (2022)", "framework": "DeepSpeed ZeRO-3",
                             "zero_stage": "3", "micro_batch": "1"})
    assert later.usable and later.scenario.zero.deepspeed_version == "0.6"      # v0.6.0-v0.19.4
    assert any("v0.6.0-v0.19.4" in a for a in later.assumptions)
    offloading = row_from_fields({**STATED, "source": "Rajbhandari et al. (SC21)", "framework": "DeepSpeed ZeRO-3",
                                  "zero_stage": "3", "micro_batch": "1", "offload": "optimizer to CPU"})
    assert offloading.scenario is not None and offloading.scenario.zero.deepspeed_version == "0.19"
    recent = row_from_fields({**STATED, "source": "a 2026 benchmark", "framework": "DeepSpeed ZeRO-3",
                              "zero_stage": "3", "micro_batch": "1"})
    assert recent.usable and recent.scenario.zero.deepspeed_version == "0.19"
    stage1 = row_from_fields({**STATED, "source": "DeepSpeed Azure blog (2022)", "framework": "DeepSpeed ZeRO-1",
                              "zero_stage": "1", "micro_batch": "1"})
    assert stage1.usable and stage1.scenario.zero.deepspeed_version == "0.19"   # older ZeRO-1/2: today's


def test_a_stated_pin_memory_pins_the_offloaded_optimizer_and_nothing_else():
    base = {**STATED, "source": "DeepSpeed Azure blog (2022)", "framework": "DeepSpeed ZeRO-3", "zero_stage": "3",
            "micro_batch": "1", "offload": "optimizer to CPU"}
    default = row_from_fields(base).scenario
    pinned = row_from_fields({**base, "other_config": "offload_optimizer.pin_memory true"}).scenario
    assert default is not None and pinned is not None
    assert not default.zero.offload_optimizer.pin_memory            # v0.6.0-v0.19.4's default
    assert pinned.zero.offload_optimizer.pin_memory and pinned.zero.offload_optimizer.device.value == "cpu"
    no_offload = row_from_fields({**base, "offload": "none", "other_config": "offload_optimizer.pin_memory true"})
    assert no_offload.scenario is not None and not no_offload.scenario.zero.offload_optimizer.enabled
