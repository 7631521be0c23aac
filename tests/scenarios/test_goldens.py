"""Scenario goldens: every bundled scenario's rounded summary against
tests/scenarios/expected/<name>.json, so a change in model behaviour shows as a JSON diff.
Rewrite them with `python -m pytest tests/scenarios/test_goldens.py --update-golden` and
review the diff."""

from __future__ import annotations

import json

import pytest

from sim.inputs.load import load_scenario
from sim.simulate import simulate
from tests.conftest import SCENARIOS

EXPECTED = SCENARIOS.parent / "tests" / "scenarios" / "expected"


def summary(path) -> dict:  # type: ignore[no-untyped-def]
    j = simulate(load_scenario(path)).to_json()
    def r(x: float) -> float:
        return float(f"{x:.6g}")
    return {"fits": j["fits"], "step_time_s": r(j["step_time_s"]), "mfu": r(j["mfu"]),
            "time": {k: r(v) for k, v in j["time"].items()},
            "peak_bytes": r(j["memory"]["peak_bytes"]),
            "comm": [{"op": c["op"], "group": c["group"], "count": c["count"],
                      "bytes_per_rank": r(c["bytes_per_rank"])} for c in j["comm"]]}


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.toml")), ids=lambda p: p.stem)
def test_scenario_summary_matches_its_golden(path, update_golden):
    got = summary(path)
    golden = EXPECTED / f"{path.stem}.json"
    if update_golden:
        golden.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    assert golden.is_file(), f"no golden for {path.stem}: run with --update-golden"
    assert got == json.loads(golden.read_text())
