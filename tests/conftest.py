"""Shared paths and helpers for the test suite."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.core.model import ModelSpec
from sim.inputs.models import load_model

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"
HARDWARE = ROOT / "hardware"
SCENARIOS = ROOT / "scenarios"


def catalog_model(name: str) -> ModelSpec:
    return load_model(name, ROOT, "test")


@pytest.fixture
def write_scenario(tmp_path: Path):
    """Write a scenario TOML (and optional side files) into a temp dir; return its path."""
    def _write(text: str, name: str = "s.toml", **files: str) -> Path:
        for fname, content in files.items():
            (tmp_path / fname.replace("__", ".")).write_text(content)
        path = tmp_path / name
        path.write_text(text)
        return path
    return _write


def pytest_addoption(parser):  # type: ignore[no-untyped-def]
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite tests/scenarios/expected/*.json from the current simulator")


@pytest.fixture
def update_golden(request) -> bool:  # type: ignore[no-untyped-def]
    return bool(request.config.getoption("--update-golden"))
