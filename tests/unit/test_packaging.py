"""The catalogs ship inside the wheel and are found when zerosim is installed from it."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

from tests.conftest import ROOT


def test_wheel_carries_the_catalogs_and_finds_them_installed(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path / "dist")], check=True, capture_output=True)
    wheel = next((tmp_path / "dist").glob("zerosim-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in ("sim/catalog/models/llama2-7b.toml", "sim/catalog/models/hf/qwen2-7b.json",
                 "sim/catalog/hardware/dgx-a100-80g.toml", "sim/catalog/hardware/gpus/b200.toml",
                 "sim/catalog/scenarios/llama2-7b_zero3_dgx-a100-80gx2.toml",
                 "sim/catalog/scenarios/ds_zero2_hf.json"):
        assert path in names, path
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                    str(wheel)], check=True, capture_output=True)
    probe = ("from sim.inputs.catalog import catalog_dir; from sim.inputs.load import load_scenario; "
             "import sim.cli, sim.validate.functional; "
             "d = catalog_dir('scenarios'); print(d); "
             "print(load_scenario(d / 'llama2-7b_zero3_dgx-a100-80gx2.toml').model.name)")
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, check=True,
                         capture_output=True, text=True).stdout.split("\n")
    assert out[0].startswith(str(target)) and out[1] == "Llama-2-7B"


def test_every_python_package_is_shipped():
    import tomllib
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "sim").rglob("__init__.py")}
    assert on_disk <= listed, on_disk - listed
