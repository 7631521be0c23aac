"""Measured collective curves in a cluster's [calibration] table (sim.inputs.calibration_table):
read, interpolated as nccl-tests' busbw, used by the simulator, and bad ones refused."""

from __future__ import annotations

import pytest

from sim.analytic import opcost
from sim.core.enums import Coll
from sim.core.errors import InputError
from sim.inputs.catalog import catalog_dir
from sim.inputs.hardware import cluster_from_table
from sim.inputs.reading import read_toml

HARDWARE = catalog_dir("hardware")
# 4 ranks: 1 KiB and 256 KiB take the same 2 ms (a latency floor), 16 MiB runs at 0.8 GB/s busbw
CURVE = [[1024, 1024 * 0.75 / 2e-3 / 1e9], [262144, 262144 * 0.75 / 2e-3 / 1e9], [16777216, 0.8]]


def local(calibration: dict) -> object:
    table = read_toml(HARDWARE / "local-cpu.toml")
    table["calibration"] = calibration
    return cluster_from_table(table, "x.toml", HARDWARE)


def seconds(cluster, nbytes: float, ranks: int = 4, coll: Coll = Coll.ALL_GATHER) -> float:
    phases = opcost.collective_phases(coll, nbytes, opcost.GroupShape(ranks, 1, ranks), cluster)
    return opcost.isolated_time(phases, cluster)


def test_a_curve_gives_the_measured_time_at_its_sizes_and_a_floor_below_them():
    c = local({"all_gather_busbw_curve": CURVE})
    assert seconds(c, 1024) == pytest.approx(2e-3, rel=1e-9)
    assert seconds(c, 262144) == pytest.approx(2e-3, rel=1e-9)
    assert seconds(c, 16777216) == pytest.approx(16777216 * 0.75 / 0.8e9, rel=1e-9)
    assert seconds(c, 16) == pytest.approx(2e-3, rel=1e-9)             # below the smallest: its time
    assert seconds(c, 64 * 2**20) == pytest.approx(4 * seconds(c, 16777216), rel=1e-9)   # above: its busbw
    # between two sizes the bus bandwidth is interpolated in log(size): halfway at the geometric mean
    mid_bw = (CURVE[1][1] + CURVE[2][1]) / 2 * 1e9
    assert seconds(c, 2**21) == pytest.approx(2**21 * 0.75 / mid_bw, rel=1e-9)


def test_a_line_of_the_same_fit_cannot_hold_the_floor():
    # the best line through 2 ms at 1 KiB and at 256 KiB has no bandwidth term; a curve keeps both
    line = local({"all_gather_alpha_us": 2e3 / 3, "all_gather_busbw_GBps": 0.8})
    curve = local({"all_gather_busbw_curve": CURVE})
    assert seconds(line, 262144) > 1.1 * seconds(curve, 262144)
    assert seconds(line, 1024) == pytest.approx(seconds(curve, 1024), rel=0.01)


def test_only_the_op_with_a_curve_uses_it():
    c = local({"all_gather_busbw_curve": CURVE})
    assert set(c.calibration_curves) == {"all_gather"} and c.calibration == {}
    base = local({})
    assert seconds(c, 1e6, coll=Coll.ALL_REDUCE) == seconds(base, 1e6, coll=Coll.ALL_REDUCE)
    assert seconds(c, 1e6) != seconds(base, 1e6)


@pytest.mark.parametrize("calibration, key, words", [
    ({"all_gather_busbw_curve": [[1024, 0.1]]}, "calibration.all_gather_busbw_curve", "1 points"),
    ({"all_gather_busbw_curve": [[1024, 0.1], [512, 0.2]]}, "all_gather_busbw_curve[1][0]", "increasing"),
    ({"all_gather_busbw_curve": [[1024, 0.1], [2048, -1]]}, "all_gather_busbw_curve[1][1]", "> 0"),
    ({"all_gather_busbw_curve": [[1024, 0.1], 7]}, "all_gather_busbw_curve[1]", "a pair"),
    ({"all_gather_busbw_curve": [[1024, 0.1], ["4 KiB", 0.2]]}, "all_gather_busbw_curve[1][0]", "a number"),
    ({"all_gather_busbw_curve": "fast"}, "calibration.all_gather_busbw_curve", "a list"),
    ({"all_gather_busbw_curve": [[1024, 0.1], [2048, 0.2]], "all_gather_alpha_us": 5.0,
      "all_gather_busbw_GBps": 1.0}, "calibration.all_gather_busbw_curve", "not both"),
    ({"all_reduce_alpha_us": 5.0}, "calibration.all_reduce_alpha_us", "needs both"),
    ({"all_reduce_busbw_GBps": 5.0}, "calibration.all_reduce_busbw_GBps", "needs both"),
])
def test_a_bad_calibration_table_is_refused_naming_its_key(calibration, key, words):
    with pytest.raises(InputError, match=r"x\.toml") as err:
        local(calibration)
    assert key in str(err.value) and words in str(err.value)
