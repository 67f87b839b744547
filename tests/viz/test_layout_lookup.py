"""Dashboard layouts resolve by one rule: the project's dashboards/ or a .py path the user gives.

`load_layout` is what `k3scale dashboard` calls; a dashboards/ folder in the current directory
and a study name such as `../bad/evil` must never select the code (issue 23).
"""

from __future__ import annotations

import pytest

from k3scale.errors import K3ScaleError
from k3scale.viz.dashboard import GENERIC, PROJECT_LAYOUTS, load_layout

EVIL = "from pathlib import Path\nPath({marker!r}).write_text('ran')\nTITLE = 'evil'\n"
MINE = "TITLE = 'mine'\ndef panels(inputs, page):\n    pass\n"


def plant(tmp_path, name: str):
    marker = tmp_path / "ran.txt"
    (tmp_path / "dashboards").mkdir(exist_ok=True)
    (tmp_path / "dashboards" / f"{name}.py").write_text(EVIL.format(marker=str(marker)))
    return marker


@pytest.mark.parametrize("explicit", [False, True])
def test_the_project_layout_wins_over_the_current_directory(tmp_path, monkeypatch, explicit):
    marker = plant(tmp_path, "k2_vs_k3")
    monkeypatch.chdir(tmp_path)
    layout = load_layout("k2_vs_k3" if explicit else None, "k2_vs_k3")
    assert layout.source == str(PROJECT_LAYOUTS / "k2_vs_k3.py")
    assert not marker.exists()


def test_a_layout_in_the_current_directory_is_used_only_when_given_as_a_path(tmp_path, monkeypatch):
    (tmp_path / "dashboards").mkdir()
    (tmp_path / "dashboards" / "mine.py").write_text(MINE)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(K3ScaleError, match="no layout 'mine'"):
        load_layout("mine", "some_study")
    assert load_layout(None, "mine") is GENERIC
    layout = load_layout("dashboards/mine.py", "mine")
    assert layout.title == "mine" and layout.source == "dashboards/mine.py"


@pytest.mark.parametrize("study", ["../bad/evil", "../dashboards/evil", "..", ""])
def test_a_study_name_that_is_not_a_file_name_gets_the_generic_layout(tmp_path, monkeypatch, study):
    marker = tmp_path / "ran.txt"
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "evil.py").write_text(EVIL.format(marker=str(marker)))
    (tmp_path / "dashboards").mkdir()
    (tmp_path / "dashboards" / "evil.py").write_text(EVIL.format(marker=str(marker)))
    monkeypatch.chdir(tmp_path)
    assert load_layout(None, study) is GENERIC
    assert not marker.exists()
