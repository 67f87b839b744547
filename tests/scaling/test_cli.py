"""`k3scale fit` from the command line: generic fits, recipes, determinism, bad input."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from k3scale.cli import main
from k3scale.scaling.tables import build_tables, write_tables
from tests.scaling.reference import reference_file
from tests.scaling.synthetic import synthetic_runs


def test_fit_surface_json_on_chinchilla(capsys):
    path = reference_file("epoch-chinchilla", "chinchilla_NDL.csv")
    code = main(
        [
            "fit",
            "surface",
            str(path),
            "--n-col",
            "N_params",
            "--d-col",
            "D_tokens",
            "--loss-col",
            "loss",
            "--exclude-col",
            "excluded_by_epoch",
            "--bootstrap",
            "20",
            "--seed",
            "3",
            "--workers",
            "1",
            "--grid",
            "coarse",
            "--json",
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_points"] == 240 and out["excluded"] == 5
    assert out["E"] == pytest.approx(1.8172, rel=0.01)
    assert out["alpha"] == pytest.approx(0.3473, rel=0.01)
    assert set(out["ci"]) >= {"E", "A", "B", "alpha", "beta"}
    assert out["ci"]["alpha"][0] < out["alpha"] < out["ci"]["alpha"][1]


def test_fit_frontier_json(tmp_path, capsys):
    c = np.logspace(16, 20, 12)
    rows = [
        {"C": x, "L": 2.0 + 2000.0 * (k * x) ** -0.2, "arch": name}
        for name, k in (("k2", 1.0), ("k3", 2.5))
        for x in c
    ]
    pl.DataFrame(rows).write_csv(tmp_path / "f.csv")
    code = main(
        [
            "fit",
            "frontier",
            str(tmp_path / "f.csv"),
            "--compute-col",
            "C",
            "--loss-col",
            "L",
            "--group-col",
            "arch",
            "--baseline",
            "k2",
            "--at",
            "1e17,1e19",
            "--bootstrap",
            "20",
            "--workers",
            "1",
            "--json",
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["groups"]) == {"k2", "k3"}
    assert out["groups"]["k3"]["alpha"] == pytest.approx(0.2, rel=0.02)
    assert [m["compute"] for m in out["multiplier"]] == [1e17, 1e19]
    assert all(m["value"] == pytest.approx(2.5, rel=0.02) for m in out["multiplier"])
    assert out["shared_exponent"]["multiplier"] == pytest.approx(2.5, rel=0.02)
    assert len(out["shared_exponent"]["ci"]) == 2 and "p_value" in out["shared_exponent"]


@pytest.mark.parametrize(
    ("rows", "args", "fragment"),
    [
        (
            [{"N": 1e8, "D": 1e9, "L": 3.0}] * 3,
            ["--n-col", "N", "--d-col", "D", "--loss-col", "L"],
            "more points than",
        ),
        (
            [{"N": 1e8, "D": 1e9, "L": 3.0}] * 8,
            ["--n-col", "N", "--d-col", "X", "--loss-col", "L"],
            "no column(s) ['X']",
        ),
        (
            [{"N": -1.0, "D": 1e9, "L": 3.0}] * 8,
            ["--n-col", "N", "--d-col", "D", "--loss-col", "L"],
            "N must be finite and positive",
        ),
        (
            [{"N": 1e8, "D": 1e9, "L": 3.0}] * 8,
            ["--n-col", "N", "--loss-col", "L"],
            "missing --d-col",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, rows, args, fragment):
    pl.DataFrame(rows).write_csv(tmp_path / "bad.csv")
    code = main(
        [
            "fit",
            "surface",
            str(tmp_path / "bad.csv"),
            *args,
            "--grid",
            "coarse",
            "--bootstrap",
            "0",
            "--workers",
            "1",
            "--json",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert fragment in err and err.count("\n") == 1


def test_frontier_group_with_one_size_exits_2(tmp_path, capsys):
    rows = [{"C": c, "L": 3.0 - 0.1 * i, "g": "a"} for i, c in enumerate([1e17, 1e18, 1e19, 1e20])]
    rows += [{"C": 1e18, "L": 2.9, "g": "b"}] * 4
    pl.DataFrame(rows).write_csv(tmp_path / "one.csv")
    code = main(
        [
            "fit",
            "frontier",
            str(tmp_path / "one.csv"),
            "--compute-col",
            "C",
            "--loss-col",
            "L",
            "--group-col",
            "g",
            "--baseline",
            "a",
            "--bootstrap",
            "0",
        ]
    )
    assert code == 2
    assert "group 'b' needs at least 3 distinct compute" in capsys.readouterr().err


def test_recipe_artifact_is_byte_identical_on_rerun(tmp_path):
    runs, curves = build_tables(synthetic_runs("k2_vs_k3", lrs=(1e-3, 5e-3, 2e-2)))
    write_tables(runs, curves, tmp_path / "tables")
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, workers in zip(paths, ("1", "2"), strict=True):
        assert (
            main(
                [
                    "fit",
                    "k2_vs_k3",
                    "--from",
                    str(tmp_path / "tables"),
                    "--out",
                    str(path),
                    "--bootstrap",
                    "10",
                    "--grid",
                    "coarse",
                    "--workers",
                    workers,
                ]
            )
            == 0
        )
    assert paths[0].read_bytes() == paths[1].read_bytes()
    artifact = json.loads(paths[0].read_text())
    prov = artifact["provenance"]
    assert len(prov["table_hash"]) == 64 and prov["options"]["num_resamples"] == 10
    assert {"package", "git_sha", "git_dirty"} <= set(prov["code"])
    conv = artifact["results"]["frontiers"]["c_6n"]
    assert conv["shared_exponent"]["fitted_multipliers"]["k3"] == pytest.approx(2.5, rel=0.2)
    assert set(artifact["results"]["frontiers"]) == {"c_6n", "c_attn"}


def test_cosine_vs_wsd_recipe_reports_the_sign(tmp_path):
    runs, curves = build_tables(
        synthetic_runs(
            "cosine_vs_wsd",
            archs=("k3",),
            schedules=("cosine", "wsd"),
            lrs=tuple(np.geomspace(1e-3, 3e-2, 8)),
        )
    )
    write_tables(runs, curves, tmp_path / "tables")
    assert (
        main(
            [
                "fit",
                "cosine_vs_wsd",
                "--from",
                str(tmp_path / "tables"),
                "--out",
                str(tmp_path / "fit.json"),
                "--bootstrap",
                "30",
                "--workers",
                "1",
            ]
        )
        == 0
    )
    results = json.loads((tmp_path / "fit.json").read_text())["results"]
    counts = results["schedule_comparison"]["sign_counts"]["wsd.sign_own"]
    assert counts.get("cosine lower", 0) >= 6, counts  # WSD is 0.01 worse in 8 cells by design


def test_unknown_recipe_names_the_known_ones(tmp_path, capsys):
    assert main(["fit", "no_such_recipe", "--from", str(tmp_path), "--out", "x.json"]) == 2
    assert "k2_vs_k3" in capsys.readouterr().err
