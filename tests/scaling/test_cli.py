"""`k3scale fit` from the command line: generic fits, recipes, determinism, bad input."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from k3scale.cli import main
from k3scale.scaling.inputs.tables import build_tables, write_tables
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


def test_fit_frontier_interval_covers_a_known_multiplier(tmp_path, capsys):
    rng = np.random.default_rng(3)
    c = np.logspace(16, 20, 12)
    rows = [
        {"C": x, "L": (2.0 + 2000.0 * (k * x) ** -0.2) * np.exp(rng.normal(0, 0.005)), "g": g}
        for g, k in (("k2", 1.0), ("k3", 2.5))
        for x in c
    ]
    pl.DataFrame(rows).write_csv(tmp_path / "f.csv")
    args = ["fit", "frontier", str(tmp_path / "f.csv"), "--compute-col", "C", "--loss-col", "L"]
    args += ["--group-col", "g", "--baseline", "k2", "--at", "1e17,1e18,1e19", "--json"]
    assert main([*args, "--bootstrap", "200", "--workers", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    for point in out["multiplier"]:
        assert point["ci"][0] <= 2.5 <= point["ci"][1], point
        assert point["verdict"] == "identified"
    assert out["groups"]["k3"]["verdict"] == "identified"


@pytest.mark.parametrize(
    ("rows", "args", "fragment"),
    [
        (
            [{"N": 1e8, "D": 1e9, "L": 3.0}] * 3,
            ["--n-col", "N", "--d-col", "D", "--loss-col", "L"],
            "more than its 5 parameters",
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
    runs, curves = build_tables(synthetic_runs("k2_vs_k3"))
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
                    "100",
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
    assert len(prov["table_hash"]) == 64 and prov["options"]["num_resamples"] == 100
    assert {"package", "git_sha", "git_dirty"} <= set(prov["code"])
    results = artifact["results"]
    assert set(results["compute_optimal"]) == {"c_6n", "c_attn"}
    # The synthetic loss is a function of k * C (k3: k = 2.5): the model-free envelope route
    # finds 2.5 inside the range both arms cover, and its interval holds it.
    middle = results["compute_optimal"]["c_6n"]["routes"]["envelope"]["multiplier"]["k3"][4]
    assert middle["verdict"] == "identified"
    assert middle["ci"][0] <= 2.5 <= middle["ci"][1]
    assert middle["value"] == pytest.approx(2.5, rel=0.05)


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
                "100",
                "--workers",
                "1",
            ]
        )
        == 0
    )
    results = json.loads((tmp_path / "fit.json").read_text())["results"]
    pooled = results["schedule_comparison"]["pooled"]["wsd"]
    # WSD is 0.01 worse in all 8 cells by design (4 sizes: 4 independent clusters).
    assert pooled["verdict"] == "identified" and pooled["clusters"] == 4
    assert pooled["point_signs"]["cosine lower"] == 8
    assert pooled["ci"][0] <= -0.01 <= pooled["ci"][1] < 0
    assert pooled["consistent"]


def test_unknown_recipe_names_the_known_ones(tmp_path, capsys):
    assert main(["fit", "no_such_recipe", "--from", str(tmp_path), "--out", "x.json"]) == 2
    assert "k2_vs_k3" in capsys.readouterr().err
