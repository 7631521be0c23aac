"""README's two set-up commands stay true: CI runs the test command verbatim."""

from __future__ import annotations

import re

from tests.conftest import ROOT


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(.+?)\n```", text)


def test_readme_has_an_install_and_run_command_and_a_test_command():
    install, tests = _readme_commands()[:2]
    assert "pip install ." in install and "zerosim memory scenarios/" in install
    assert "pip install -e '.[test]'" in tests and "pytest" in tests
    scenario = install.split("zerosim memory ")[1].split()[0]
    assert (ROOT / scenario).is_file()


def test_ci_runs_the_readme_test_command_verbatim():
    tests = _readme_commands()[1]
    assert tests in (ROOT / ".ci" / "run").read_text()


def test_readme_plot_exists():
    assert (ROOT / "docs" / "img" / "memory-llama2-7b-zero3.png").is_file()
