"""Fit recipes are code: found only in the project's analysis/ or at a path the user gives.

Issue 23: an analysis/ folder in the current directory must not shadow (or add to) the
project's recipes, and a recipe name is a plain identifier, never a path fragment.
"""

from __future__ import annotations

import pytest

from k3scale.cli import main
from k3scale.errors import K3ScaleError
from k3scale.scaling.artifact import PROJECT_RECIPES, recipe_path

EVIL = "from pathlib import Path\nPath({marker!r}).write_text('ran')\ndef run(*a): return {{}}\n"


def plant(tmp_path, name: str):
    """An analysis/<name>.py in tmp_path that leaves a marker file when imported."""
    marker = tmp_path / "ran.txt"
    (tmp_path / "analysis").mkdir(exist_ok=True)
    (tmp_path / "analysis" / f"{name}.py").write_text(EVIL.format(marker=str(marker)))
    return marker


@pytest.mark.parametrize("name", ["k2_vs_k3", "only_here"])
def test_an_analysis_folder_in_the_current_directory_is_not_searched(
    tmp_path, monkeypatch, capsys, name
):
    marker = plant(tmp_path, name)
    monkeypatch.chdir(tmp_path)
    args = ["fit", name, "--from", str(tmp_path / "no_tables"), "--out", str(tmp_path / "f.json")]
    assert main(args) == 2
    assert not marker.exists()
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    if name == "only_here":
        assert "no analysis recipe 'only_here'" in err


def test_a_name_resolves_to_the_project_recipe_whatever_the_current_directory(
    tmp_path, monkeypatch
):
    marker = plant(tmp_path, "k2_vs_k3")
    monkeypatch.chdir(tmp_path)
    assert recipe_path("k2_vs_k3") == PROJECT_RECIPES / "k2_vs_k3.py"
    assert not marker.exists()


@pytest.mark.parametrize("name", ["../analysis/k2_vs_k3", "analysis/k2_vs_k3", "k2-vs-k3", ""])
def test_a_recipe_name_must_be_an_identifier(tmp_path, monkeypatch, name):
    plant(tmp_path, "k2_vs_k3")
    monkeypatch.chdir(tmp_path / "analysis")
    with pytest.raises(K3ScaleError, match="plain identifier"):
        recipe_path(name)


def test_an_explicit_py_path_is_used_as_given(tmp_path):
    marker = plant(tmp_path, "mine")
    assert recipe_path(str(tmp_path / "analysis" / "mine.py")) == tmp_path / "analysis" / "mine.py"
    assert not marker.exists()
    with pytest.raises(K3ScaleError, match="does not exist"):
        recipe_path(str(tmp_path / "missing.py"))
