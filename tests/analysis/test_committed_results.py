"""The committed study results: `k3scale fit` on the committed tables reproduces the committed
fit JSON (everything but the code version that produced it), offline, and the dashboards render."""

from __future__ import annotations

import json
import re
from html import escape as html_escape
from pathlib import Path

import polars as pl
import pytest

from k3scale.cli import main
from k3scale.scaling.headline import headline_lines

RESULTS = Path(__file__).resolve().parents[2] / "analysis" / "results"
FOLDERS = sorted(p for p in RESULTS.glob("*") if (p / "runs.parquet").exists())


def test_there_are_committed_results_for_every_study():
    names = {p.name.rsplit("-", 1)[0] for p in FOLDERS}
    assert {"cosine_vs_wsd", "k2_vs_k3", "k3_ablations"} <= names


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_fit_is_reproduced_from_the_committed_tables(folder, tmp_path):
    analysis = folder.name.rsplit("-", 1)[0]
    out = tmp_path / "fit.json"
    committed = folder / "fit.json"
    # Not bitwise: numpy's and OpenBLAS's paths differ between AVX2 and AVX-512 CPUs; the rule
    # and why its tolerance is enough are in k3scale/scaling/reproduce.py.
    assert (
        main(["fit", analysis, "--from", str(folder), "--out", str(out), "--check", str(committed)])
        == 0
    )


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_dashboard_renders_offline_from_the_committed_tables(folder, tmp_path):
    analysis = folder.name.rsplit("-", 1)[0]
    page = tmp_path / "page.html"
    args = [
        "dashboard",
        "--from",
        str(folder),
        "--fit",
        str(folder / "fit.json"),
        "--layout",
        analysis,
    ]
    assert main([*args, "--out", str(page)]) == 0
    html = page.read_text()
    # plotly.js itself mentions its CDN in strings; what matters is that no script loads from it.
    assert not re.search(r"<script[^>]+src=[\"']https?:", html)
    # Every figure the layout builds is drawn or listed with its reason: the demo folders (one
    # cell per arm) list their frontier and surface figures instead of drawing them.
    skipped = re.search(r'<ul class="skipped">(.*?)</ul>', html)
    listed = skipped.group(1).count("<li>") if skipped else 0
    assert html.count("Plotly.newPlot(") >= 6 and html.count("Plotly.newPlot(") + listed >= 10
    # The headline numbers and their verdicts head the page, as the CLI report prints them.
    for line in headline_lines(json.loads((folder / "fit.json").read_text())):
        assert html_escape(line.strip()) in html
    # The title says what was tuned: batch too only where the trials searched it (issue 37).
    title = re.search(r"<title>(.*?)</title>", html).group(1)
    batches = pl.read_parquet(folder / "runs.parquet").filter(pl.col("arm") == "tuned")
    searched = batches["batch_size"].n_unique() > 1
    assert ("peak LR and batch" in title) == (searched and analysis == "cosine_vs_wsd"), title
