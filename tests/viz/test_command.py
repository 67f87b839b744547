"""`k3scale dashboard` end to end on the committed fixture: offline page, provenance, errors."""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

import polars as pl
import pytest

from k3scale.cli import main
from k3scale.errors import K3ScaleError
from k3scale.scaling.inputs.tables import table_hash
from k3scale.viz import export_png
from k3scale.viz.page import PLOTLY_JS_ID
from tests.viz.fit_fixture import fit_artifact

DATA = Path(__file__).parent / "data"


def page_without_plotly_js(text: str) -> str:
    """The page minus the inline plotly.js bundle (whose source mentions URLs it never fetches)."""
    start = text.index(f'<script id="{PLOTLY_JS_ID}">')
    end = text.index("</script>", start)
    return text[:start] + text[end:]


@pytest.fixture(scope="module")
def page(tmp_path_factory, fit_files) -> str:
    out = tmp_path_factory.mktemp("page") / "k2_vs_k3.html"
    args = ["dashboard", "--from", str(DATA), "--fit", str(fit_files["k2_vs_k3"])]
    assert main([*args, "--layout", "k2_vs_k3", "--out", str(out)]) == 0
    return out.read_text(encoding="utf-8")


def test_page_is_self_contained(page):
    assert not re.search(r"<script[^>]+src=", page)
    rest = page_without_plotly_js(page)
    assert "cdn.plot.ly" not in rest
    assert not re.search(r"https?://", rest)
    assert page.count(f'<script id="{PLOTLY_JS_ID}">') == 1


def test_page_has_every_figure_with_caption_and_provenance(page, runs, fits):
    sections = re.findall(r'<section id="([^"]+)" class="panel">', page)
    assert sections[:3] == [
        "overview",
        "multiplier-k3-over-k2-c_6n",
        "multiplier-k3-over-k2-c_attn",
    ]
    assert len(sections) == len(set(sections)) >= 15
    assert page.count('<p class="caption">') == len(sections)
    for key in sections:
        assert f'id="fig-{key}"' in page
    assert table_hash(runs) in page
    assert "runs trained at 0123456789ab" in page
    assert re.search(r"sha256 [0-9a-f]{16}", page)
    # The answers head the page; every number with its verdict is folded below them, and the
    # figures follow (issue 51: the first figure sat 1,150 px down under 24 bullets).
    assert fits.answers and fits.headline
    first_answer = page.index(html.escape(fits.answers[0].strip()))
    folded = page.index('<details class="numbers">')
    assert first_answer < folded < page.index('<section id="overview"')
    assert all(html.escape(line.strip()) in page for line in fits.answers + fits.headline)
    assert page.index('<ul class="headline">') > folded


def test_js_file_mode_writes_plotly_next_to_the_page(tmp_path):
    out = tmp_path / "page.html"
    assert main(["dashboard", "--from", str(DATA), "--js", "file", "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert f'<script id="{PLOTLY_JS_ID}" src="plotly.min.js"></script>' in text
    assert (tmp_path / "plotly.min.js").stat().st_size > 1_000_000
    assert "no fit file, so no fitted cell optimum or frontier" in text


def _study_folder(root: Path, name: str) -> Path:
    tables = root / name / "tables"
    tables.mkdir(parents=True)
    for file in ("runs.parquet", "curves.parquet"):
        shutil.copy(DATA / file, tables / file)
    return root / name


def test_study_name_resolves_its_folder_and_fit(tmp_path, capsys, fit_files):
    folder = _study_folder(tmp_path / "studies", "fixture-demo")
    shutil.copy(fit_files["k2_vs_k3"], folder / "fit.json")
    out = tmp_path / "page.html"
    root = str(tmp_path / "studies")
    assert main(["dashboard", "fixture", "--studies-root", root, "--out", str(out)]) == 0
    assert str(folder / "fit.json") in out.read_text(encoding="utf-8")
    _study_folder(tmp_path / "studies", "fixture-cpu")
    assert main(["dashboard", "fixture", "--studies-root", root, "--out", str(out)]) == 2
    assert "pass --preset" in capsys.readouterr().err
    args = ["dashboard", "fixture", "--preset", "gpu", "--studies-root", root, "--out", str(out)]
    assert main(args) == 2
    assert "k3scale export" in capsys.readouterr().err


def test_unsupported_figures_are_listed_not_fatal(tmp_path, capsys):
    runs = pl.read_parquet(DATA / "runs.parquet").filter(pl.col("size").str.ends_with("t2"))
    curves = pl.read_parquet(DATA / "curves.parquet")
    runs.write_parquet(tmp_path / "runs.parquet")
    curves.write_parquet(tmp_path / "curves.parquet")
    fit = tmp_path / "fit.json"
    fit.write_text(json.dumps(fit_artifact("k2_vs_k3", runs, curves)))
    out = tmp_path / "page.html"
    assert main(["dashboard", "--from", str(tmp_path), "--fit", str(fit), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "skipped: the Chinchilla view of k3 cosine needs several sizes" in said
    assert "skipped: no IsoFLOP view of k3" in said
    assert "Figures the data could not support" in out.read_text(encoding="utf-8")
    assert main(["dashboard", "--from", str(tmp_path), "--out", str(out)]) == 0
    assert "the cell optima of `k3scale fit` (no fit file given)" in capsys.readouterr().out


def test_attempts_the_server_lost_mid_start_are_named_not_fatal(tmp_path, capsys):
    """Two failed attempts of a server restart: one whose tags never arrived (no arch, nothing
    else), and one created with its tags whose params never arrived (no size, LR or N)."""
    runs = pl.read_parquet(DATA / "runs.parquet")
    untagged = {"run_id": "lost-tags", "status": "failed"}
    tagged = {
        **{k: runs.row(0, named=True)[k] for k in ("study", "cell", "trial", "arch", "schedule")},
        **{"run_id": "lost-params", "status": "failed"},
    }
    with_lost = pl.concat([runs, pl.DataFrame([untagged, tagged])], how="diagonal_relaxed")
    with_lost.write_parquet(tmp_path / "runs.parquet")
    shutil.copy(DATA / "curves.parquet", tmp_path / "curves.parquet")
    out = tmp_path / "page.html"
    assert main(["dashboard", "--from", str(tmp_path), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "2 run(s) without the arch, schedule, lr, batch_size, n_active" in said
    assert "left out of the figures: lost-tags (failed), lost-params (failed)" in said
    page = out.read_text(encoding="utf-8")
    assert f"<td>runs</td><td>{runs.height + 2}</td>" in page and "lost-params (failed)" in page


def test_an_attempt_without_params_leaves_the_study_layout_whole(tmp_path, capsys):
    """The committed cosine_vs_wsd (cpu_v2) tables plus a failed attempt that has its tags and
    nothing else: the LR-batch landscape sorted its batch sizes, and a missing one crashed it."""
    source = Path(__file__).resolve().parents[2] / "analysis/results/cosine_vs_wsd-cpu_v2"
    runs = pl.read_parquet(source / "runs.parquet")
    tags = ("study", "cell", "trial", "arm", "arch", "schedule", "size", "budget_tokens")
    attempt = {k: runs.row(0, named=True)[k] for k in tags} | {"run_id": "x", "status": "failed"}
    pl.concat([runs, pl.DataFrame([attempt])], how="diagonal_relaxed").write_parquet(
        tmp_path / "runs.parquet"
    )
    shutil.copy(source / "curves.parquet", tmp_path / "curves.parquet")
    out = tmp_path / "page.html"
    assert main(["dashboard", "--from", str(tmp_path), "--out", str(out)]) == 0
    assert "left out of the figures: x (failed)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--fit", "missing.json"], "does not exist"),
        (["--layout", "no_such_layout"], "no layout 'no_such_layout'"),
        (["--metric", "final_nonsense"], "final_nonsense"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, extra, message):
    out = tmp_path / "page.html"
    assert main(["dashboard", "--from", str(DATA), *extra, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_png_without_a_browser_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    with pytest.raises(K3ScaleError, match="apt-get install chromium"):
        export_png.find_browser()
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "nope"))
    with pytest.raises(K3ScaleError, match="BROWSER_PATH"):
        export_png.find_browser()


def test_the_schedule_page_title_reads_as_one_phrase():
    """Issue 51: "(batch fixed at 7 sequences) (fixed lr_min)" read as two afterthoughts."""
    from k3scale.commands.dashboard import render

    folder = Path(__file__).resolve().parents[2] / "analysis" / "results" / "cosine_vs_wsd-cpu_v3"
    html_text, _, _ = render(
        folder, folder / "fit.json", "cosine_vs_wsd", "final_val_ood_loss", "file"
    )
    title = re.search(r"<title>(.*?)</title>", html_text).group(1)
    assert title.startswith(
        "Cosine vs WSD at per-schedule tuned peak LR, batch fixed at 7 sequences, fixed lr_min"
    ), title
    assert ") (" not in title
