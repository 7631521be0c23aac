"""`zerosim fit` (sim.studies.fit): recovers known physical parameters from step times the
DES produced with them, keeps parameters in bounds, cross-validates by folds, writes
hardware files that load, and refuses bad options."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from sim.cli import main
from sim.des.engine import Mode
from sim.inputs.catalog import catalog_dir
from sim.inputs.hardware import load_cluster, load_gpu
from sim.simulate import simulate
from sim.studies import fit as fit_module
from sim.studies import fit_objective
from sim.studies import fit_report as report
from sim.studies.fit import Evaluator, FitRow, fit, folds_of
from sim.studies.fit_params import (
    CLUSTER_BOUNDS,
    HOST_BOUNDS,
    IDEAL_AT_CEILING,
    IDEAL_AT_FLOOR,
    applied,
    chip,
    from_unit,
    ideal_start,
    parameters,
    rewrite_toml,
    spans_decades,
    to_unit,
)
from sim.studies.gemm_table import GEMM_BOUND, measured, median_errors
from tests.crosscheck.scenarios import tiny


def rows_made_with(values: dict[str, float]) -> list[FitRow]:
    """Tiny scenarios of several shapes whose 'published' step time is the DES's own under
    `values` (parameter name -> value)."""
    out = []
    for n, (strategy, seq, mb) in enumerate((("ddp", 512, 2), ("ddp", 2048, 4), ("ds-zero3", 1024, 1),
                                             ("ds-zero3", 256, 2), ("ddp", 128, 8), ("ds-zero3", 2048, 2))):
        s = tiny(strategy, seq_len=seq, micro_batch=mb)
        params = [p for p in parameters([s]) if p.name in values]
        truth = applied(s, params, [values[p.name] for p in params])
        out.append(FitRow(f"R{n}", s, simulate(truth).step_time_s))
    return out


TRUTH = {"A100.matmul_efficiency": 0.65, "host.zero3_hook_us": 900.0}


def test_fit_recovers_the_parameters_that_made_the_step_times():
    rows = rows_made_with(TRUTH)
    result = fit(rows, folds=0, jobs=1, only=("matmul_efficiency", "host.zero3_hook_us"))
    got = dict(zip((p.name for p in result.params), result.values, strict=True))
    assert got["A100.matmul_efficiency"] == pytest.approx(0.65, rel=0.03)
    assert got["host.zero3_hook_us"] == pytest.approx(900.0, rel=0.15)
    for r in rows:
        assert result.predicted[r.id] == pytest.approx(r.measured_s, rel=0.02)


def test_the_report_says_whether_a_fit_converged_or_stopped_at_the_cap():
    """One iteration from the catalog's start cannot reach 0.65 and 900 us: the in-sample
    outcome says it stopped at the cap; with the default iterations it converges."""
    rows = rows_made_with(TRUTH)
    keys = ("matmul_efficiency", "host.zero3_hook_us")
    capped = fit(rows, folds=0, jobs=1, only=keys, iterations=1)
    full = fit(rows, folds=0, jobs=1, only=keys)
    (a,), (b,) = capped.outcomes, full.outcomes
    assert not a.converged and a.iterations == 2
    assert b.converged and b.cost < a.cost
    assert "stopped at the iteration cap" in report.outcomes_line(capped)
    assert report.outcomes_line(full).startswith("Fits: in-sample converged")


def test_fit_stays_inside_the_bounds():
    rows = [replace(r, measured_s=r.measured_s * 3.0) for r in rows_made_with({})]   # no physical answer
    result = fit(rows, folds=0, jobs=1, only=("matmul_efficiency",))
    (p,), (v,) = result.params, result.values
    assert p.low <= v <= p.high
    assert v == pytest.approx(p.low, abs=0.02)


def test_a_smaller_knee_lets_an_outlier_pull_less():
    """Soft-L1: a row 50% slow (a mechanism the model lacks) drags a near-quadratic fit
    (knee 1) off the value that made the other rows; with the knee at 2% it counts
    linearly and the fit stays near that value."""
    rows = rows_made_with({"A100.matmul_efficiency": 0.7})
    rows[0] = replace(rows[0], measured_s=rows[0].measured_s * 1.5)
    got = {knee: fit(rows, folds=0, jobs=1, only=("matmul_efficiency",), knee=knee) for knee in (1.0, 0.02)}
    assert all(r.knee == k for k, r in got.items())
    off = {knee: abs(r.values[0] - 0.7) for knee, r in got.items()}
    assert off[0.02] < 0.5 * off[1.0]
    assert off[0.02] < 0.02


def test_cross_validation_predicts_each_row_from_the_other_folds():
    rows = rows_made_with({"A100.matmul_efficiency": 0.7})
    result = fit(rows, folds=3, jobs=1, only=("matmul_efficiency",))
    assert sorted(result.cross_validated) == sorted(r.id for r in rows)
    assert len(result.fold_values) == 3
    assert [o["fit"] for o in report.outcomes_table(result)] == ["in-sample", "fold 1", "fold 2", "fold 3"]
    folds = folds_of(rows, 3)
    assert sorted(i for f in folds for i in f) == list(range(len(rows)))
    for r in rows:
        assert math.isfinite(result.cross_validated[r.id])
        assert result.cross_validated[r.id] == pytest.approx(r.measured_s, rel=0.05)


def test_folds_start_from_the_priors_not_from_values_fitted_on_their_held_out_rows():
    """The catalog's A100 GEMM efficiency was fitted on the published rows, held-out ones
    included: each fold starts from its prior (0.859, MAMF tables) instead, by default; the
    in-sample fit starts from the catalog unless asked to start from the priors too."""
    from sim.studies.fit_params import prior_values
    rows = rows_made_with({"A100.matmul_efficiency": 0.7})
    keys = ("matmul_efficiency",)
    catalog = catalog_dir("hardware")
    warm = fit(rows, folds=2, jobs=1, only=keys)                  # priors: the catalog's by default
    (prior,) = prior_values(warm.params, catalog)
    assert prior is not None and warm.start != [prior]          # the catalog's value is a fitted one
    assert warm.fold_start == [prior]
    assert "the folds from the priors" in report.outcomes_line(warm)
    leaky = fit(rows, folds=2, jobs=1, only=keys, priors=None)    # asked for: every fit from the catalog
    assert leaky.fold_start == leaky.start == warm.start
    assert "no priors read" in report.outcomes_line(leaky)
    cold = fit(rows, folds=2, jobs=1, only=keys, priors=catalog, from_priors=True)
    assert cold.start == cold.fold_start == [prior]
    assert "Every fit started from the priors" in report.outcomes_line(cold)
    for r in rows:                                               # the folds still reach the truth
        assert warm.cross_validated[r.id] == pytest.approx(r.measured_s, rel=0.05)


def test_rewrite_toml_keeps_the_prior_and_the_table():
    text = "[inter_node]\nefficiency = 0.86  # nccl-tests\n\n[host]\nlaunch_us = 5.0  # HTA\n"
    out = rewrite_toml(text, "host.launch_us", 7.25, "zerosim fit")
    assert "launch_us = 7.25  # zerosim fit; prior 5.0: HTA" in out
    assert "efficiency = 0.86  # nccl-tests" in out
    again = rewrite_toml(out, "host.launch_us", 8.0, "zerosim fit")
    assert again.count("prior") == 1 and "prior 5.0: HTA" in again


def test_written_hardware_files_load(tmp_path):
    from sim.studies.fit_params import write_files
    s = tiny("ds-zero3")
    params = parameters([s], ("matmul_efficiency", "host.zero3_hook_us", "comm_interference"))
    chosen = {"A100.matmul_efficiency": 0.7, "host.zero3_hook_us": 800.0, "A100.comm_interference": 0.2}
    written = write_files(params, [chosen[p.name] for p in params], catalog_dir("hardware"), tmp_path,
                          lambda p: "test fit")
    names = {p.relative_to(tmp_path).as_posix() for p in written}
    assert "gpus/a100-sxm4-80g.toml" in names and "dgx-a100-80g.toml" in names
    assert load_gpu(tmp_path / "gpus" / "a100-sxm4-80g.toml").matmul_efficiency == pytest.approx(0.7)
    assert load_gpu(tmp_path / "gpus" / "a100-sxm4-80g.toml").comm_interference == pytest.approx(0.2)
    host = load_cluster(tmp_path / "dgx-a100-80g.toml").node.host
    assert host.zero3_hook == pytest.approx(800e-6)


def test_priors_are_read_back_from_the_comments_a_fit_wrote(tmp_path):
    import shutil

    from sim.studies.fit_params import prior_values, write_files
    s = tiny("ds-zero3")
    params = parameters([s], ("matmul_efficiency", "host.zero3_hook_us"))
    catalog = catalog_dir("hardware")
    first = prior_values(params, catalog)
    copy = tmp_path / "hardware"
    shutil.copytree(catalog, copy)
    for values in ([0.61, 900.0], [0.7, 1500.0]):      # two fits in a row, written in place
        write_files(params, values, copy, copy, lambda p: "zerosim fit")
        assert prior_values(params, copy) == first      # the first prior survives refits
    assert load_gpu(copy / "gpus" / "a100-sxm4-80g.toml").matmul_efficiency == pytest.approx(0.7)
    assert all(v is not None for v in first)


@pytest.mark.parametrize("argv, key", [
    (["fit", "missing.csv"], "missing.csv"),
    (["fit", "x.csv", "--folds", "0"], "--folds"),
    (["fit", "x.csv", "--params", "warp_drive"], "--params"),
    (["fit", "x.csv", "--loss-knee", "0"], "--loss-knee"),
    (["fit", "x.csv", "--loss-knee", "nan"], "--loss-knee"),
    (["fit", "x.csv", "--write-hardware", "no/such/folder"], "--write-hardware"),
])
def test_bad_fit_options_exit_2_naming_the_key(argv, key, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.csv").write_text("id,metric,value\n")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("zerosim: error:") and key in err and "\n" == err[-1] and err.count("\n") == 1


def test_parts_on_one_die_share_the_chip_parameters_at_one_power_limit():
    """H100 80 GB and H200 are one GH100 die at 700 W: one fitted value; the 96 GB Grand
    Teton part runs that die at 500 W, whose sustained clocks are its own."""
    gpus = catalog_dir("hardware") / "gpus"
    names = {chip(load_gpu(gpus / f)) for f in ("h100-sxm5-80g.toml", "h200-sxm-141g.toml")}
    assert names == {"H100"}
    assert chip(load_gpu(gpus / "h100-sxm-96g-hbm2e.toml")) == "H100-500W"
    assert chip(load_gpu(gpus / "a100-sxm4-40g.toml")) == chip(load_gpu(gpus / "a100-sxm4-80g.toml")) == "A100"


def test_a_row_with_variants_is_predicted_by_the_fastest():
    """An unstated micro-batch (sim.studies.published_micro): the row's prediction is the
    fastest of its variants under the parameters tried, so the choice follows the clock."""
    slow, fast = tiny("ddp", seq_len=2048, micro_batch=4), tiny("ddp", seq_len=512, micro_batch=2)
    t_slow, t_fast = (simulate(v, steps=1, mode=Mode.REPRESENTATIVE).step_time_s for v in (slow, fast))
    assert t_fast != t_slow
    row = FitRow("V", slow, 1.0, alternatives=(slow, fast))
    assert row.variants == (slow, fast)
    with Evaluator([row], [], jobs=1) as ev:
        assert ev.predict([0], [])[0] == pytest.approx(min(t_slow, t_fast), rel=1e-9)
        assert ev.chosen(0, []) is (fast if t_fast < t_slow else slow)


def test_the_fresh_pageable_copy_rate_is_fitted_only_where_such_copies_run():
    """DeepSpeed's `cpu_checkpointing` copies each checkpoint into a tensor `.to("cpu")`
    allocates: its host's rate is a parameter of those scenarios alone, moved per host CPU."""
    plain = tiny("ds-zero2", recompute="full")
    offloaded = replace(plain, training=replace(plain.training, cpu_checkpointing=True))
    key = "host.fresh_pageable_d2h_GBps"
    assert not [p for p in parameters([plain]) if p.key == key]
    (param,) = [p for p in parameters([offloaded]) if p.key == key]
    assert param.scope == offloaded.cluster.host.cpu and param.low < 1.4 < param.high
    slow, fast = (simulate(applied(offloaded, [param], [v])).step_time_s for v in (param.low, param.high))
    assert slow > fast


def test_a_measured_gemm_table_holds_the_h100_file_where_its_gemms_run(monkeypatch):
    """Step times made with H100 GEMMs slower than XLA measured them (efficiency 0.58, HBM
    efficiency 0.6) pull the fit down; the GEMM table's constraint keeps the fitted H100 file
    within its 10% median |error|, over every shape and the large ones (the penalty starts
    half a point inside, so the fit's optimum does not cross it), where the fit without it
    goes to 0.58."""
    h100 = load_cluster(catalog_dir("hardware") / "dgx-h100.toml")
    made = []
    for n, (seq, mb) in enumerate(((512, 2), (2048, 4), (1024, 1))):
        s = replace(tiny("ddp", seq_len=seq, micro_batch=mb), cluster=h100)
        params = [p for p in parameters([s]) if p.key in ("matmul_efficiency", "memory_bandwidth_efficiency")]
        truth = applied(s, params, [0.58 if p.key == "matmul_efficiency" else 0.6 for p in params])
        made.append(FitRow(f"H{n}", s, simulate(truth).step_time_s))
    result = fit(made, folds=0, jobs=1, only=("matmul_efficiency", "memory_bandwidth_efficiency"))
    got = dict(zip((p.key for p in result.params), result.values, strict=True))
    gpu = applied(made[0].scenario, result.params, result.values).cluster.node.gpu
    assert max(median_errors(gpu, measured("H100"))) < GEMM_BOUND
    assert got["matmul_efficiency"] > 0.63
    monkeypatch.setattr(fit_objective, "GEMM_WEIGHT", 0.0)                  # without the table
    free = fit(made, folds=0, jobs=1, only=("matmul_efficiency", "memory_bandwidth_efficiency"))
    loose = dict(zip((p.key for p in free.params), free.values, strict=True))
    assert loose["matmul_efficiency"] == pytest.approx(0.58, abs=0.02)


def test_a_fit_without_folds_reports_no_cross_validated_figures():
    """`--folds 1`: the block's CV cells stay empty (no 'nan%'), and it says where the fit
    started."""
    result = fit(rows_made_with(TRUTH), folds=0, jobs=1, only=("matmul_efficiency",))
    rows = rows_made_with(TRUTH)
    text = report.markdown(report.table(rows, result), result, ["made.csv"])
    assert "nan" not in text
    assert "| all | 6 | " in text and "|  |  |  |" in text
    assert "No folds: the fit started from" in text


@pytest.mark.parametrize(("options", "says", "converges"), [
    ({"solver": "exact"}, "exact trust-region steps", True),
    ({"scale": "log"}, "a decade or more on a log scale", False)])   # subspace steps: near the truth at the cap
def test_each_solver_option_recovers_the_parameters_and_the_block_says_which_ran(options, says, converges):
    rows = rows_made_with(TRUTH)
    keys = ("matmul_efficiency", "host.zero3_hook_us")
    result = fit(rows, folds=0, jobs=1, only=keys, **options)
    got = dict(zip((p.name for p in result.params), result.values, strict=True))
    assert got["A100.matmul_efficiency"] == pytest.approx(0.65, rel=0.03)
    assert got["host.zero3_hook_us"] == pytest.approx(900.0, rel=0.15)
    if converges:
        assert result.outcomes[0].converged
    assert says in report.markdown(report.table(rows, result), result, ["made.csv"])
    default = fit(rows, folds=0, jobs=1, only=keys)
    assert says not in report.markdown(report.table(rows, default), default, ["made.csv"])


def test_a_range_of_decades_maps_onto_the_unit_interval_by_ratios():
    hook = next(p for p in parameters([tiny("ds-zero3")]) if p.key == "host.zero3_hook_us")
    assert spans_decades(hook)
    assert to_unit(hook, 200.0, log=True) == pytest.approx(0.5)          # 20-2,000 us: 200 is halfway
    assert to_unit(hook, 200.0, log=False) == pytest.approx(180 / 1980)
    for u in (0.0, 0.3, 1.0):
        assert to_unit(hook, from_unit(hook, u, log=True), log=True) == pytest.approx(u)


def test_loss_is_the_cost_the_fit_reports_at_its_values():
    rows = rows_made_with(TRUTH)
    keys = ("matmul_efficiency", "host.zero3_hook_us")
    result = fit(rows, folds=0, jobs=1, only=keys, iterations=2)
    with Evaluator(rows, result.params, 1) as ev:
        assert fit_objective.loss(ev, range(len(rows)), result.values) == pytest.approx(result.outcomes[0].cost, rel=1e-6)
        assert fit_objective.loss(ev, range(len(rows)), result.values) < fit_objective.loss(ev, range(len(rows)), result.start)


def test_an_ideal_second_start_keeps_the_lower_loss_and_the_block_says_which_start_won(tmp_path, monkeypatch):
    rows = rows_made_with(TRUTH)
    keys = ("matmul_efficiency", "host.zero3_hook_us")
    real = fit_module.fit_rows

    def ideal_wins(ev, idx, x0, *args):          # the fit from the ideal start (hook at its floor) ends lower
        values, outcome = real(ev, idx, x0, *args)
        hook = next(j for j, p in enumerate(ev.params) if p.key == "host.zero3_hook_us")
        return values, replace(outcome, cost=outcome.cost / 2 if x0[hook] == ev.params[hook].low else outcome.cost)

    monkeypatch.setattr(fit_module, "fit_rows", ideal_wins)
    path = tmp_path / "fit.json"
    plain = fit(rows, folds=0, jobs=1, only=keys, iterations=1, from_priors=True, checkpoint=path)
    assert plain.outcomes[0].start == ""
    both = fit(rows, folds=0, jobs=1, only=keys, iterations=1, from_priors=True, ideal=True, checkpoint=path)
    assert set(json.loads(path.read_text())["fits"]) == {"in-sample", "in-sample from the ideal start"}
    assert both.outcomes[0].start == "ideal" and both.outcomes[0].cost < plain.outcomes[0].cost
    text = report.markdown(report.table(rows, both), both, ["made.csv"])
    assert "also ran from the ideal start" in text and "from the ideal start, loss" in text
    monkeypatch.setattr(fit_module, "fit_rows", real)
    unfaked = fit(rows, folds=0, jobs=1, only=keys, iterations=1, from_priors=True)
    again = fit(rows, folds=0, jobs=1, only=keys, iterations=1, from_priors=True, ideal=True)
    assert again.outcomes[0].cost <= unfaked.outcomes[0].cost


def test_no_second_fit_runs_when_the_start_is_already_ideal(monkeypatch):
    rows = rows_made_with({"A100.matmul_efficiency": 0.65})
    calls = []
    real = fit_module.fit_rows
    monkeypatch.setattr(fit_module, "fit_rows", lambda *a, **k: calls.append(1) or real(*a, **k))
    fit(rows, folds=0, jobs=1, only=("matmul_efficiency",), iterations=1, ideal=True)
    assert len(calls) == 1


def test_the_ideal_start_puts_host_costs_at_their_floors_and_rates_at_their_ceilings():
    params = parameters([tiny("ds-zero3")])
    x = [(p.low + p.high) / 2 for p in params]
    ideal = dict(zip((p.key for p in params), ideal_start(params, x), strict=True))
    by_key = {p.key: p for p in params}
    assert ideal["host.zero3_hook_us"] == by_key["host.zero3_hook_us"].low
    assert ideal["host.launch_us"] == by_key["host.launch_us"].low
    assert ideal["matmul_efficiency"] == pytest.approx((by_key["matmul_efficiency"].low + by_key["matmul_efficiency"].high) / 2)
    # every host and network parameter has its ideal end, and nothing else does
    assert set(IDEAL_AT_FLOOR) | set(IDEAL_AT_CEILING) == set(CLUSTER_BOUNDS) | set(HOST_BOUNDS)
    assert not set(IDEAL_AT_FLOOR) & set(IDEAL_AT_CEILING)
