"""`k3scale dashboard` runs layout code only from the project's dashboards/ or a named file.

A run table is data: a study name such as `../evil` inside it must never pick the code that
renders it, and neither may a dashboards/ folder in the current directory (issue 23).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl

from k3scale.cli import main

DATA = Path(__file__).parent / "data"
EVIL = "from pathlib import Path\nPath({marker!r}).write_text('ran')\nTITLE = 'evil'\n"


def tables_named(study: str, folder: Path) -> Path:
    folder.mkdir(parents=True)
    runs = pl.read_parquet(DATA / "runs.parquet").with_columns(pl.lit(study).alias("study"))
    runs.write_parquet(folder / "runs.parquet")
    shutil.copy(DATA / "curves.parquet", folder / "curves.parquet")
    return folder


def test_a_study_name_in_the_table_never_selects_code(tmp_path, monkeypatch):
    marker = tmp_path / "ran.txt"
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "evil.py").write_text(EVIL.format(marker=str(marker)))
    # `cwd/dashboards/../bad/evil.py` is the file a path-joined name would reach.
    (tmp_path / "dashboards").mkdir()
    monkeypatch.chdir(tmp_path)
    tables = tables_named("../bad/evil", tmp_path / "tables")
    assert main(["dashboard", "--from", str(tables), "--out", str(tmp_path / "page.html")]) == 0
    assert not marker.exists()
    assert "k3scale study dashboard" in (tmp_path / "page.html").read_text(encoding="utf-8")


def test_a_dashboards_folder_in_the_current_directory_is_not_searched(tmp_path, monkeypatch):
    marker = tmp_path / "ran.txt"
    (tmp_path / "dashboards").mkdir()
    (tmp_path / "dashboards" / "k2_vs_k3.py").write_text(EVIL.format(marker=str(marker)))
    monkeypatch.chdir(tmp_path)
    tables = tables_named("k2_vs_k3", tmp_path / "tables")
    assert main(["dashboard", "--from", str(tables), "--out", str(tmp_path / "page.html")]) == 0
    assert not marker.exists()
