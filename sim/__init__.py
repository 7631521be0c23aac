"""zerosim: a discrete-event performance simulator for distributed LLM training.

The public API, by the data flow (design.md):

    scenario = sim.load_scenario("scenarios/llama2-7b_zero3_dgx-a100-80gx2.toml")   # inputs
    schedule = sim.plan(scenario)                 # engines: what each rank issues, in order
    result = sim.simulate(scenario)               # des + results: when, and what it costs
    result.to_json()                              # the results contract
    sim.scenario_report(scenario)                 # the memory table of `zerosim memory`
    sim.sweep("scenarios/....toml", {"zero.stage": [1, 2, 3]})   # studies: a pandas DataFrame

Sub-packages, from the ground up: core (vocabulary), analytic (closed forms) and inputs
(files -> Scenario), engines (one model per training engine -> Schedule), des (the SimPy
engine) and results, simulate, studies and validate, cli. Names resolve lazily, so
`import sim` costs nothing until one is used.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_API = {
    "load_scenario": "sim.inputs.load", "scenario_from_table": "sim.inputs.load",
    "Scenario": "sim.inputs.scenario", "InputError": "sim.core.errors",
    "plan": "sim.engines.plan", "resident_memory": "sim.engines.plan", "model_of": "sim.engines.plan",
    "simulate": "sim.simulate", "SimulationResult": "sim.simulate",
    "scenario_report": "sim.results.memory_report", "quick_report": "sim.results.memory_report",
    "event_table": "sim.results.tables", "collective_summary": "sim.results.tables",
    "chrome_trace": "sim.results.trace", "sweep": "sim.studies.sweep",
}
__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'sim' has no attribute {name!r}")
    return getattr(import_module(_API[name]), name)
