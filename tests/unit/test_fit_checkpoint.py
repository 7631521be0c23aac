"""`zerosim fit --checkpoint` (sim.studies.fit_checkpoint): a fit stopped part-way resumes
from its finished fits and ends where an uninterrupted fit ends; a checkpoint of other
options or a file that is not one is refused, naming the file and the key."""

from __future__ import annotations

import json

import pytest

from sim.cli import main
from sim.core.errors import InputError
from sim.studies import fit as fit_module
from sim.studies.fit import fit
from tests.unit.test_fit import rows_made_with

KEYS = ("matmul_efficiency",)


class Stop(Exception):
    """The run killed part-way."""


def _same(a: fit_module.FitResult, b: fit_module.FitResult) -> None:
    assert a.values == b.values and a.fold_values == b.fold_values
    assert a.predicted == b.predicted and a.cross_validated == b.cross_validated
    assert a.outcomes == b.outcomes


def test_a_stopped_fit_resumes_from_its_finished_fits_and_ends_as_an_uninterrupted_one(tmp_path, monkeypatch):
    rows = rows_made_with({"A100.matmul_efficiency": 0.7})
    whole = fit(rows, folds=3, jobs=1, only=KEYS)
    path = tmp_path / "fit.json"
    real, calls = fit_module.fit_rows, []

    def dies_on_the_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise Stop
        return real(*args, **kwargs)
    monkeypatch.setattr(fit_module, "fit_rows", dies_on_the_third)
    with pytest.raises(Stop):
        fit(rows, folds=3, jobs=1, only=KEYS, checkpoint=path)
    assert sorted(json.loads(path.read_text())["fits"]) == ["fold 1", "in-sample"]

    calls.clear()
    monkeypatch.setattr(fit_module, "fit_rows", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    lines: list[str] = []
    resumed = fit(rows, folds=3, jobs=1, only=KEYS, checkpoint=path, progress=lines.append)
    assert len(calls) == 2                                        # folds 2 and 3 only
    assert f"in-sample: taken from {path}" in lines and f"fold 1: taken from {path}" in lines
    _same(resumed, whole)
    assert sorted(json.loads(path.read_text())["fits"]) == ["fold 1", "fold 2", "fold 3", "in-sample"]

    calls.clear()
    again = fit(rows, folds=3, jobs=1, only=KEYS, checkpoint=path)
    assert calls == []
    _same(again, whole)


def test_a_checkpoint_of_other_options_or_not_a_checkpoint_is_refused(tmp_path):
    rows = rows_made_with({"A100.matmul_efficiency": 0.7})
    path = tmp_path / "fit.json"
    fit(rows, folds=0, jobs=1, only=KEYS, iterations=1, checkpoint=path)
    with pytest.raises(InputError) as error:
        fit(rows, folds=0, jobs=1, only=KEYS, iterations=2, checkpoint=path)
    assert str(path) in str(error.value) and "fingerprint" in str(error.value) and "--iterations" in str(error.value)
    with pytest.raises(InputError, match="fingerprint"):       # another row set
        fit(rows[:-1], folds=0, jobs=1, only=KEYS, iterations=1, checkpoint=path)
    with pytest.raises(InputError, match="fingerprint"):       # another solver
        fit(rows, folds=0, jobs=1, only=KEYS, iterations=1, checkpoint=path, solver="exact")
    with pytest.raises(InputError, match="fingerprint"):       # another scale
        fit(rows, folds=0, jobs=1, only=KEYS, iterations=1, checkpoint=path, scale="log")
    path.write_text("{}")
    with pytest.raises(InputError) as error:
        fit(rows, folds=0, jobs=1, only=KEYS, iterations=1, checkpoint=path)
    assert str(path) in str(error.value) and "not a checkpoint zerosim fit wrote" in str(error.value)


@pytest.mark.parametrize("flag_value", ["no/such/folder/fit.json", "fit.txt"])
def test_a_checkpoint_path_that_cannot_be_one_exits_2(flag_value, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.csv").write_text("id,metric,value\n")
    assert main(["fit", "x.csv", "--checkpoint", flag_value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zerosim: error:") and "--checkpoint" in err and err.count("\n") == 1


def test_the_fingerprint_covers_the_simulators_code(tmp_path, monkeypatch):
    from sim.studies import fit_checkpoint
    monkeypatch.setattr(fit_checkpoint, "PACKAGE", tmp_path)
    (tmp_path / "engine.py").write_text("SPEED = 1\n")
    before = fit_checkpoint.fingerprint(["rows", 5])
    assert fit_checkpoint.fingerprint(["rows", 5]) == before
    assert fit_checkpoint.fingerprint(["rows", 6]) != before
    (tmp_path / "engine.py").write_text("SPEED = 2\n")
    assert fit_checkpoint.fingerprint(["rows", 5]) != before
