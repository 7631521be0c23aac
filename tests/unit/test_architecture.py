"""The tree follows the data flow (design.md, shared/layout.md): no import runs upward, no
import circles, the analytic twin never imports simpy, torch only inside sim.validate, and
the code is pyflakes- and import-order-clean (ruff)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

SIM = ROOT / "sim"
# floors from the ground up; a module may import its own floor and the ones below
FLOORS = [
    {"sim.core"},
    {"sim.analytic", "sim.inputs"},
    {"sim.engines"},
    {"sim.des", "sim.results"},
    {"sim.simulate"},
    {"sim.studies", "sim.validate"},
    {"sim.cli", "sim.cli_checks", "sim"},
]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "sim":
                out |= {f"sim.{a.name}" for a in node.names}
            else:
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def floor(module: str) -> int:
    for level, members in enumerate(FLOORS):
        for top in sorted(members, key=len, reverse=True):
            if module == top or module.startswith(top + "."):
                return level
    raise AssertionError(f"{module} is on no floor")


MODULES = {module_name(p): imports(p) for p in SIM.rglob("*.py")}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_runs_upward(module):
    for target in MODULES[module]:
        if target.startswith("sim.") and not target.startswith("sim.catalog"):
            assert floor(target) <= floor(module), f"{module} (floor {floor(module)}) imports {target}"


def test_no_import_circles():
    graph = {m: {t for t in deps if t in MODULES} for m, deps in MODULES.items()}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in graph[m]:
            if state.get(t) == 1:
                raise AssertionError("import circle: " + " -> ".join([*path[path.index(t):], t]))
            if t not in state:
                visit(t, [*path, t])
        state[m] = 2
    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_core_imports_nothing_else_of_sim_and_only_validate_imports_torch():
    for module, deps in MODULES.items():
        if module.startswith("sim.core"):
            assert all(d.startswith("sim.core") for d in deps if d.startswith("sim")), module
        if module.startswith("sim.analytic"):
            assert not any(d.split(".")[0] == "simpy" for d in deps), module
        if not module.startswith("sim.validate"):
            assert not any(d.split(".")[0] in ("torch", "deepspeed", "transformers") for d in deps), module


def test_import_sim_is_cheap_and_names_its_api():
    code = "import sys, sim; print(len(sim.__all__), 'simpy' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT).stdout.split()
    assert int(out[0]) >= 8 and out[1:] == ["False", "False"]


@pytest.mark.skipif(shutil.which("ruff") is None and not (Path(sys.executable).parent / "ruff").exists(),
                    reason="ruff is not installed")
def test_ruff_is_clean():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    p = subprocess.run([ruff, "check", "sim", "tests", "bench"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-2000:]


@pytest.mark.skipif(shutil.which("mypy") is None and not (Path(sys.executable).parent / "mypy").exists(),
                    reason="mypy is not installed")
def test_mypy_is_clean():
    """Typed ops and engines: mypy (configured in pyproject.toml) finds nothing in sim/."""
    mypy = shutil.which("mypy") or str(Path(sys.executable).parent / "mypy")
    p = subprocess.run([mypy], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-3000:]
