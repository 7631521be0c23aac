"""`zerosim run` names the fitted parameters at a bound of the fit that a step depends on
(sim.studies.fit_params.leaning_on_bounds): where the published-row fit pushed a physical
property as far as it may go, a prediction that leans on it should say so."""

from __future__ import annotations

import json

from sim.cli import main
from sim.inputs.load import load_scenario
from sim.studies.fit_params import applied, leaning_on_bounds, parameters
from tests.conftest import SCENARIOS
from tests.crosscheck.scenarios import tiny


def at(strategy: str, values: dict[str, float]):
    """A tiny scenario with the named fitted parameters set to `values`."""
    s = tiny(strategy)
    params = [p for p in parameters([s]) if p.name in values]
    assert {p.name for p in params} == set(values)
    return applied(s, params, [values[p.name] for p in params])


def named(s) -> dict[str, str]:
    return {line.split(" ")[0]: line for line in leaning_on_bounds(s)}


def test_a_value_near_a_bound_or_past_it_is_named_and_one_inside_is_not():
    s = at("ddp", {"A100.kernel_overhead_us": 14.9, "A100.memory_bandwidth_efficiency": 0.61,
                   "A100.matmul_efficiency": 0.72, "A100.comm_interference": 0.5})
    found = named(s)
    assert "ceiling 15" in found["A100.kernel_overhead_us"]
    assert "floor 0.6" in found["A100.memory_bandwidth_efficiency"]
    assert "outside the fit's bounds 0-0.4" in found["A100.comm_interference"]
    assert "A100.matmul_efficiency" not in found


def test_a_range_of_decades_is_judged_on_a_log_scale():
    """A ZeRO-3 hook of 21 us lies near its 20 us floor on a 20-2,000 us range; 100 us does
    not, though on a linear scale it lies within 5% of the range from the floor (4%)."""
    assert "host.zero3_hook_us" in named(at("ds-zero3", {"host.zero3_hook_us": 21.0}))
    assert "host.zero3_hook_us" not in named(at("ds-zero3", {"host.zero3_hook_us": 100.0}))


def test_only_parameters_the_step_depends_on_are_named():
    """A DDP step runs no ZeRO-3 hooks: their cost at its floor is not this step's concern."""
    s = at("ddp", {"A100.kernel_overhead_us": 5.0})
    zero3 = [p for p in parameters([tiny("ds-zero3")]) if p.name == "host.zero3_hook_us"]
    s = applied(s, zero3, [20.0])
    assert "host.zero3_hook_us" not in named(s)


def test_run_reports_them_as_a_note_in_text_and_json(capsys):
    path = SCENARIOS / "llama2-7b_zero3_dgx-a100-80gx2.toml"
    expected = leaning_on_bounds(load_scenario(path))
    assert main(["run", str(path), "--json"]) == 0
    notes = [n for n in json.loads(capsys.readouterr().out)["notes"] if n.startswith("fit:")]
    if expected:
        assert len(notes) == 1 and all(item in notes[0] for item in expected)
    else:
        assert notes == []
    assert main(["run", str(path)]) == 0
    assert ("note: fit:" in capsys.readouterr().out) == bool(expected)


def test_explain_reports_them_too(capsys):
    """The hidden / exposed verdicts lean on the same parameters (comm_interference above all)."""
    path = SCENARIOS / "llama2-7b_zero3_dgx-a100-80gx2.toml"
    expected = leaning_on_bounds(load_scenario(path))
    assert main(["explain", str(path), "--no-search", "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert [n for n in notes if n.startswith("fit:")] == ([notes[0]] if expected else [])
    assert all(item in notes[0] for item in expected)
