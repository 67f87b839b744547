"""`k3scale fit` on bad or degenerate input: exit 2 with one line, and a good fit.json survives.

Issue 23: a zero-row table, a recipe of another study, too few distinct points, unreadable files
and duplicated rows must not produce (or overwrite) an artifact that looks like a result.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from k3scale.cli import main
from k3scale.scaling.inputs.tables import build_tables, write_tables
from tests.scaling.synthetic import synthetic_runs

OLD_FIT = b'{"analysis": "an earlier good fit"}\n'
# A recipe file of our own: it reports what it was given, so a test sees what the fit saw.
COUNTING_RECIPE = (
    "def run(runs, curves, options):\n"
    "    return {'num_runs': runs.height, 'num_curve_rows': curves.height}\n"
)
FAST = ["--bootstrap", "0", "--grid", "coarse", "--workers", "1"]


def study_tables(folder: Path, study: str, **kwargs) -> Path:
    runs, curves = build_tables(synthetic_runs(study, sizes=("t0", "t1"), lrs=(1e-3,), **kwargs))
    write_tables(runs, curves, folder)
    return folder


def fails_with_one_line(capsys, args: list[str], fragment: str) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert fragment in err, err
    assert err.count("\n") == 1 and "internal error" not in err, err


def test_zero_row_table_exits_2_and_keeps_the_previous_fit(tmp_path, capsys):
    runs, curves = build_tables(synthetic_runs("k2_vs_k3"))
    write_tables(runs.clear(), curves.clear(), tmp_path / "tables")
    out = tmp_path / "fit.json"
    out.write_bytes(OLD_FIT)
    args = ["fit", "k2_vs_k3", "--from", str(tmp_path / "tables"), "--out", str(out), *FAST]
    fails_with_one_line(capsys, args, "has no rows")
    assert out.read_bytes() == OLD_FIT
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fit.json", "tables"]


def test_artifact_is_replaced_only_once_complete(tmp_path, capsys):
    tables = study_tables(tmp_path / "tables", "k2_vs_k3")
    recipe = tmp_path / "counting.py"
    recipe.write_text(COUNTING_RECIPE)
    out = tmp_path / "out" / "fit.json"
    out.parent.mkdir()
    out.write_bytes(OLD_FIT)
    assert main(["fit", str(recipe), "--from", str(tables), "--out", str(out), *FAST]) == 0
    assert json.loads(out.read_text())["results"]["num_runs"] == 8
    assert [p.name for p in out.parent.iterdir()] == ["fit.json"]
    # A file where a folder should be: the write fails cleanly and leaves nothing behind.
    blocked = tmp_path / "out" / "fit.json" / "fit.json"
    args = ["fit", str(recipe), "--from", str(tables), "--out", str(blocked), *FAST]
    fails_with_one_line(capsys, args, "cannot write")
    assert [p.name for p in out.parent.iterdir()] == ["fit.json"]


def test_out_naming_a_folder_exits_2(tmp_path, capsys):
    tables = study_tables(tmp_path / "tables", "k2_vs_k3")
    args = ["fit", "k2_vs_k3", "--from", str(tables), "--out", str(tmp_path), *FAST]
    fails_with_one_line(capsys, args, "is a folder")


@pytest.mark.parametrize(
    ("recipe", "study", "kwargs"),
    [
        ("cosine_vs_wsd", "k2_vs_k3", {}),
        ("k2_vs_k3", "cosine_vs_wsd", {"archs": ("k3",), "schedules": ("cosine", "wsd")}),
    ],
)
def test_recipe_of_another_study_is_refused(tmp_path, capsys, recipe, study, kwargs):
    tables = study_tables(tmp_path / "tables", study, **kwargs)
    out = tmp_path / "fit.json"
    args = ["fit", recipe, "--from", str(tables), "--out", str(out), *FAST]
    fails_with_one_line(capsys, args, f"holds studies {study}")
    assert not out.exists()


@pytest.mark.parametrize(
    ("recipe", "kwargs", "fragment"),
    [
        ("k2_vs_k3", {"archs": ("k2",)}, "compares archs k2, k3"),
        ("cosine_vs_wsd", {"archs": ("k3",)}, "compares schedules cosine, wsd"),
    ],
)
def test_table_without_both_compared_arms_is_refused(tmp_path, capsys, recipe, kwargs, fragment):
    tables = study_tables(tmp_path / "tables", recipe, **kwargs)
    args = ["fit", recipe, "--from", str(tables), "--out", str(tmp_path / "fit.json"), *FAST]
    fails_with_one_line(capsys, args, fragment)


def test_duplicated_runs_are_collapsed_with_a_warning(tmp_path, capsys):
    runs, curves = build_tables(synthetic_runs("k2_vs_k3", sizes=("t0",), lrs=(1e-3,)))
    write_tables(pl.concat([runs, runs.head(2)]), pl.concat([curves, curves]), tmp_path / "t")
    recipe = tmp_path / "counting.py"
    recipe.write_text(COUNTING_RECIPE)
    out = tmp_path / "fit.json"
    assert main(["fit", str(recipe), "--from", str(tmp_path / "t"), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "2 duplicated run row(s) collapsed" in err and runs["run_id"][0] in err
    artifact = json.loads(out.read_text())
    assert artifact["results"] == {"num_runs": runs.height, "num_curve_rows": curves.height}
    assert artifact["provenance"]["duplicate_rows_collapsed"] == 2


def test_one_run_id_with_two_different_rows_is_refused(tmp_path, capsys):
    runs, curves = build_tables(synthetic_runs("k2_vs_k3", sizes=("t0",), lrs=(1e-3,)))
    changed = runs.head(1).with_columns(pl.col("final_val_ood_loss") + 1.0)
    write_tables(pl.concat([runs, changed]), curves, tmp_path / "t")
    args = ["fit", "k2_vs_k3", "--from", str(tmp_path / "t"), "--out", str(tmp_path / "f.json")]
    fails_with_one_line(capsys, [*args, *FAST], "several different rows")


def surface_args(path: Path) -> list[str]:
    return ["fit", "surface", str(path), "--n-col", "N", "--d-col", "D", "--loss-col", "L"]


def grid_points() -> pl.DataFrame:
    """4 x 4 (N, D) grid from known parameters, 1% noise."""
    n = np.repeat([1e7, 3e7, 1e8, 3e8], 4)
    d = np.tile([1e9, 3e9, 1e10, 3e10], 4)
    loss = 1.8 + 400.0 / n**0.34 + 410.0 / d**0.28
    return pl.DataFrame(
        {"N": n, "D": d, "L": loss * (1 + 0.01 * np.random.default_rng(0).normal(size=16))}
    )


@pytest.mark.parametrize(
    ("points", "fragment"),
    [
        (
            pl.DataFrame({"N": [1e8] * 10, "D": [1e9] * 10, "L": [3.0] * 10}),
            "got 1 distinct (N, D) points",
        ),
        (grid_points().filter(pl.col("D") < 1e10), "got 2 distinct D values"),
        (grid_points().filter(pl.col("N") < 1e8), "got 2 distinct N values"),
    ],
)
def test_surface_with_too_few_distinct_points_exits_2(tmp_path, capsys, points, fragment):
    points.write_csv(tmp_path / "few.csv")
    fails_with_one_line(capsys, [*surface_args(tmp_path / "few.csv"), *FAST], fragment)


def test_surface_duplicates_are_collapsed_and_do_not_narrow_intervals(tmp_path, capsys):
    grid = grid_points()
    grid.write_csv(tmp_path / "once.csv")
    pl.concat([grid, grid, grid.head(3)]).write_csv(tmp_path / "twice.csv")
    fitted = []
    for name in ("once.csv", "twice.csv"):
        args = [*surface_args(tmp_path / name), "--bootstrap", "20", "--grid", "coarse"]
        assert main([*args, "--workers", "1", "--json"]) == 0
        captured = capsys.readouterr()
        fitted.append((json.loads(captured.out), captured.err))
    (once, quiet), (twice, warned) = fitted
    assert not quiet and "19 duplicated row(s)" in warned and "collapsed" in warned
    assert twice["n_points"] == once["n_points"] == 16 and twice["duplicates"] == 19
    assert twice["ci"] == once["ci"]


def frontier_args(path: Path) -> list[str]:
    return [
        *("fit", "frontier", str(path), "--compute-col", "C", "--loss-col", "L"),
        *("--group-col", "g", "--baseline", "a", "--bootstrap", "10", "--workers", "1"),
    ]


def test_frontier_of_repeated_points_exits_2(tmp_path, capsys):
    rows = [
        {"C": c, "L": 2.0 + 2000.0 * (k * c) ** -0.2, "g": g}
        for g, k in (("a", 1.0), ("b", 2.5))
        for c in (1e17, 1e18, 1e19)
    ]
    pl.DataFrame(rows * 3).write_csv(tmp_path / "f.csv")
    fails_with_one_line(capsys, frontier_args(tmp_path / "f.csv"), "more points than")


@pytest.mark.parametrize(
    ("content", "fragment"),
    [(b"", "is empty"), (bytes(range(256)) * 4, "is not a readable CSV")],
)
@pytest.mark.parametrize("kind", ["surface", "frontier"])
def test_unreadable_csv_exits_2(tmp_path, capsys, content, fragment, kind):
    (tmp_path / "bad.csv").write_bytes(content)
    args = surface_args if kind == "surface" else frontier_args
    fails_with_one_line(capsys, args(tmp_path / "bad.csv"), fragment)


@pytest.mark.parametrize("command", ["fit", "dashboard"])
def test_garbage_parquet_exits_2(tmp_path, capsys, command):
    tables = tmp_path / "tables"
    tables.mkdir()
    for name in ("runs.parquet", "curves.parquet"):
        (tables / name).write_bytes(b"not parquet at all\n" * 10)
    out = tmp_path / ("fit.json" if command == "fit" else "page.html")
    head = ["fit", "k2_vs_k3"] if command == "fit" else ["dashboard"]
    fails_with_one_line(
        capsys, [*head, "--from", str(tables), "--out", str(out)], "not a readable parquet"
    )
    assert not out.exists()


def test_parquet_without_the_contract_columns_exits_2(tmp_path, capsys):
    tables = tmp_path / "tables"
    tables.mkdir()
    pl.DataFrame({"x": [1, 2]}).write_parquet(tables / "runs.parquet")
    pl.DataFrame({"x": [1, 2]}).write_parquet(tables / "curves.parquet")
    args = ["fit", "k2_vs_k3", "--from", str(tables), "--out", str(tmp_path / "f.json")]
    fails_with_one_line(capsys, args, "lacks column(s) ['run_id'")


def test_k2_vs_k3_fits_a_table_on_wsd_the_schedule_of_its_v2_preset(tmp_path, capsys):
    tables = study_tables(tmp_path / "tables", "k2_vs_k3", schedules=("wsd",))
    out = tmp_path / "fit.json"
    assert main(["fit", "k2_vs_k3", "--from", str(tables), "--out", str(out), *FAST]) == 0
    assert json.loads(out.read_text())["provenance"]
