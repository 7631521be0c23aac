"""Figures of sweep tables and of one step (sim.results.study_plots, `zerosim plot`,
`zerosim sweep --plot`): each draws what its table says, writes PNG and SVG, and refuses
what is not a zerosim table with one line."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import pandas as pd
import pytest
from matplotlib.figure import Figure

import sim
from sim.cli import main
from sim.results import study_plots as sp
from tests.unit.test_sweep import SCENARIO


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    path = tmp_path_factory.mktemp("plots") / "tiny.toml"
    path.write_text(SCENARIO)
    df = sim.sweep(path, {"nodes": [1, 2], "zero.stage": [2, 3], "training.micro_batch": [1, 2]}, jobs=1)
    return path, df


def test_rows_say_what_each_point_is(table):
    _, df = table
    assert set(df["gpus"]) == {8, 16} and set(df["strategy"]) == {"deepspeed z2", "deepspeed z3"}
    assert set(df["layout"]) == {"1/1/8", "1/1/16"}
    row = df.iloc[0]
    assert row["tokens_per_gpu"] == 32 * 512 / row["gpus"]


def test_throughput_lines_follow_the_table_one_per_strategy(table):
    _, df = table
    ax = sp.throughput_vs_gpus(Figure().add_subplot(), df[df["training.micro_batch"] == 2])
    lines = {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}
    assert set(lines) == {"deepspeed z2", "deepspeed z3"}
    z3 = df[(df["strategy"] == "deepspeed z3") & (df["training.micro_batch"] == 2)].sort_values("gpus")
    assert list(lines["deepspeed z3"].get_xdata()) == list(z3["gpus"])
    assert list(lines["deepspeed z3"].get_ydata()) == pytest.approx(list(z3["tokens_per_s"]))


def test_breakdown_bars_stack_to_the_parts_and_skip_points_without_a_result(table):
    _, df = table
    infeasible = df.iloc[:1].assign(feasible=False, step_time_s=float("nan"))
    ax = sp.step_breakdown(Figure().add_subplot(), pd.concat([df, infeasible]))
    assert len(ax.get_xticklabels()) == len(df)
    tops = {}
    for container in ax.containers:
        for i, bar in enumerate(container):
            tops[i] = max(tops.get(i, 0.0), bar.get_y() + bar.get_height())
    parts = df[[c for _, c in sp.TIME_PARTS]].sum(axis=1)
    assert [tops[i] for i in range(len(df))] == pytest.approx(list(parts))


def test_the_commands_write_png_and_svg_and_refuse_other_tables(table, tmp_path, capsys):
    path, df = table
    csv = tmp_path / "t.csv"
    df.to_csv(csv, index=False)
    for kind, suffix in (("throughput", "png"), ("tflops", "svg"), ("breakdown", "png"), ("memory", "svg"),
                         ("exposed", "png")):
        out = tmp_path / f"{kind}.{suffix}"
        assert main(["plot", str(csv), "--kind", kind, "--out", str(out)]) == 0
        assert out.stat().st_size > 1000
    assert (tmp_path / "tflops.svg").read_text().lstrip().startswith("<?xml")
    out = tmp_path / "line.png"
    assert main(["plot", str(path), "--kind", "timeline", "--out", str(out)]) == 0 and out.stat().st_size > 1000
    swept = tmp_path / "sweep.png"
    assert main(["sweep", str(path), "--vary", "nodes=1,2", "--jobs", "1", "--no-progress", "--plot", str(swept)]) == 0
    assert swept.stat().st_size > 1000
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    capsys.readouterr()
    assert main(["plot", str(other), "--kind", "throughput", "--out", str(tmp_path / "x.png")]) == 2
    assert "not a zerosim sweep or search table" in capsys.readouterr().err
    assert main(["plot", str(csv), "--kind", "throughput", "--by", "colour", "--out", str(tmp_path / "x.png")]) == 2
    assert "colour" in capsys.readouterr().err
