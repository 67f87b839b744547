"""A finished smoke study seen in a real browser through `k3scale ui`.

Runs the smoke preset of `experiments/k2_vs_k3.py`, serves its folder with `k3scale ui`, and
drives headless Chromium (Playwright, the system's /usr/bin/chromium) through MLflow 3.17's UI:
the experiment's runs list shows every run, and with the arch, schedule, size and budget tag
columns added through the "Columns" picker each row shows its run's tag values; a new browser
opens the experiment from the Experiments list on its runs (model training, not GenAI) with the
k3scale view's columns, keeps a column set of its own, and keeps a GenAI choice made in the sidebar; one run's "Model metrics" tab draws its `train/loss`
curve with one vertex per logged step. Screenshots land in the test's tmp folder and their paths
are printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from k3scale.commands.ui import runs_url
from k3scale.data.sample import prepare_sample
from k3scale.track import schema
from k3scale.track.sending import RUNS_VIEW_COLUMNS
from k3scale.track.ui_app import RUNS_STATE_KEY, WORKFLOW_KEY
from tests.sweep.test_study_runs import K2_VS_K3, mlflow_runs, run_to_end
from tests.track.ui_server import read_ui_url

pytestmark = pytest.mark.slow

STUDY = "k2_vs_k3"
SHOWN_TAGS = (schema.TAG_ARCH, schema.TAG_SCHEDULE, schema.TAG_SIZE, schema.TAG_BUDGET_TOKENS)
CHROMIUM = "/usr/bin/chromium"
# platform.md section 9: the flags that keep Chromium offline and headless in a container.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# A busy 2-core machine: server start and the UI's first render can each take tens of seconds.
UI_WAIT_MS = 90_000
# Wide enough that the added tag columns are rendered next to the default ones.
VIEWPORT = {"width": 2400, "height": 1000}


def free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def study_ui(study_dir: Path) -> Iterator[str]:
    """`k3scale ui --study-dir` as a child process; yields its URL; SIGINT by pid at the end."""
    command = [sys.executable, "-m", "k3scale.cli", "ui", "--study-dir", str(study_dir)]
    command += ["--port", str(free_port())]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        yield read_ui_url(process)
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=60)
        assert process.returncode == 0 and "stopped" in out, out
    finally:
        if process.poll() is None:
            # SIGINT lets `k3scale ui` stop the MLflow server it started; a SIGKILL alone left
            # that server running after a failed check.
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)


def tag_cell(page, run_id: str, tag: str):
    return page.locator(f'.ag-row[row-id="{run_id}"] .ag-cell[col-id="tags.`{tag}`"]')


def add_tag_columns(page, tags: tuple[str, ...]) -> None:
    """Tick each tag in the runs table's "Columns" picker (search box, then its label)."""
    page.get_by_role("button", name="Columns", exact=True).click()
    search = page.get_by_placeholder("Search columns")
    for tag in tags:
        search.fill(tag)
        page.get_by_role("dialog").get_by_text(tag, exact=True).click()
    page.keyboard.press("Escape")


def check_runs_list(page, url: str, experiment_id: str, runs: list, shots: Path) -> None:
    """The link `k3scale ui` prints: every run, with the k3scale view's columns filled in."""
    page.goto(runs_url(url, experiment_id), wait_until="load")
    for run in runs:
        page.get_by_text(run.info.run_name, exact=True).wait_for(timeout=UI_WAIT_MS)
    page.screenshot(path=shots / "runs-list.png")
    assert page.get_by_text(f"{len(runs)} matching runs").is_visible()
    for column in RUNS_VIEW_COLUMNS:
        assert page.locator(f'.ag-header-cell[col-id="{column}"]').count() == 1, column
    for run in runs:
        peak = page.locator(
            f'.ag-row[row-id="{run.info.run_id}"] .ag-cell[col-id="metrics.`peak_lr`"]'
        )
        assert float(peak.inner_text()) == pytest.approx(float(run.data.params["optim.lr"]))
    add_tag_columns(page, tuple(t for t in SHOWN_TAGS if f"tags.`{t}`" not in RUNS_VIEW_COLUMNS))
    for run in runs:
        for tag in SHOWN_TAGS:
            cell = tag_cell(page, run.info.run_id, tag)
            cell.wait_for(timeout=UI_WAIT_MS)
            assert cell.is_visible(), (run.info.run_name, tag)
            assert cell.inner_text().strip() == run.data.tags[tag], (run.info.run_name, tag)
    page.screenshot(path=shots / "runs-list-tags.png")


def workflow_choice(page) -> str | None:
    """The browser's stored GenAI/model-training choice (MLflow 3.17's localStorage key)."""
    return page.evaluate(f"window.localStorage.getItem({json.dumps(WORKFLOW_KEY)})")


def check_new_browser_opens_training_and_keeps_a_choice(
    page, url: str, experiment_id: str, num_runs: int, shots: Path
) -> None:
    """A browser that never chose a view: from the Experiments list (a link without
    `?workflowType=`) the experiment opens on its runs, not on GenAI, with nothing clicked first
    (the page of `k3scale ui` stores the model-training choice) and shows the k3scale view's
    columns; a column set of the browser's own survives a reload. Once the user picks "GenAI" in
    the sidebar, a reload keeps that choice and a bare experiment link opens GenAI."""
    page.goto(f"{url}/#/experiments", wait_until="load")
    page.get_by_text(STUDY, exact=True).first.click()
    page.get_by_text(f"{num_runs} matching runs").wait_for(timeout=UI_WAIT_MS)
    page.screenshot(path=shots / "experiments-list-to-runs.png")
    assert page.get_by_text("matching runs").first.is_visible()
    assert "/runs" in page.url and "Detect Issues" not in page.content()
    assert workflow_choice(page) == json.dumps("machine_learning")
    # The k3scale view's columns, though the link carried no `viewStateShareKey`.
    for column in RUNS_VIEW_COLUMNS:
        header = page.locator(f'.ag-header-cell[col-id="{column}"]')
        header.wait_for(timeout=UI_WAIT_MS)
        assert header.count() == 1, column
    # A column choice of the browser's own is not overwritten by the page on reload.
    key = RUNS_STATE_KEY.replace('["<experiment id>"]', json.dumps([experiment_id]))
    own = json.dumps({"selectedColumns": [RUNS_VIEW_COLUMNS[0]]})
    page.evaluate("([k, v]) => window.localStorage.setItem(k, v)", [key, own])
    page.reload(wait_until="load")
    page.get_by_text(f"{num_runs} matching runs").wait_for(timeout=UI_WAIT_MS)
    page.locator(f'.ag-header-cell[col-id="{RUNS_VIEW_COLUMNS[0]}"]').wait_for(timeout=UI_WAIT_MS)
    assert page.locator(f'.ag-header-cell[col-id="{RUNS_VIEW_COLUMNS[1]}"]').count() == 0
    # (MLflow itself writes its whole state back under the key: compare the columns.)
    kept = json.loads(page.evaluate("k => window.localStorage.getItem(k)", key))
    assert kept["selectedColumns"] == [RUNS_VIEW_COLUMNS[0]], kept

    page.get_by_text("GenAI", exact=True).first.click()
    page.get_by_text("Detect Issues").first.wait_for(timeout=UI_WAIT_MS)
    page.reload(wait_until="load")
    page.get_by_text("Detect Issues").first.wait_for(timeout=UI_WAIT_MS)
    assert workflow_choice(page) == json.dumps("genai"), "the page overwrote the user's choice"
    page.goto(f"{url}/#/experiments/{experiment_id}", wait_until="load")
    page.get_by_text("Detect Issues").first.wait_for(timeout=UI_WAIT_MS)
    page.screenshot(path=shots / "genai-choice-kept.png")
    assert "matching runs" not in page.content() and workflow_choice(page) == json.dumps("genai")


def check_train_loss_chart(page, run, history: list, shots: Path) -> None:
    """Open the run from the list; its Model metrics tab plots `train/loss` at every step."""
    page.get_by_text(run.info.run_name, exact=True).click()
    page.get_by_role("tab", name="Model metrics").click()
    page.get_by_placeholder("Search metric charts").fill(schema.METRIC_TRAIN_LOSS)
    legend = page.get_by_text(f"{run.info.run_name} ({schema.METRIC_TRAIN_LOSS})", exact=True)
    legend.wait_for(timeout=UI_WAIT_MS)
    line = page.locator(".scatterlayer .trace path.js-line").first
    line.wait_for(timeout=UI_WAIT_MS)
    page.screenshot(path=shots / "run-train-loss.png")
    # The chart is Plotly: its div carries the traces it drew (x = step, y = value).
    traces = page.locator(".js-plotly-plot").first.evaluate(
        "el => el.data.map(t => ({x: Array.from(t.x), y: Array.from(t.y)}))"
    )
    assert traces, "the train/loss chart has no trace"
    assert traces[0]["x"] == [m.step for m in history]
    assert traces[0]["y"] == pytest.approx([m.value for m in history], rel=1e-6)
    # And it drew them: one marker per step, and a line through distinct heights. Plotly
    # simplifies the path (drops near-collinear vertices), so vertices are not counted exactly.
    assert page.locator(".scatterlayer .trace .points path.point").count() == len(history)
    vertices = re.findall(r"[ML]\s*-?[\d.]+,\s*-?[\d.]+", line.get_attribute("d") or "")
    assert len({float(v.split(",")[1]) for v in vertices}) > 1, "flat or empty train/loss line"


def test_study_runs_tags_and_loss_curve_show_in_the_mlflow_ui(tmp_path):
    from mlflow.tracking import MlflowClient
    from playwright.sync_api import sync_playwright

    data_root = tmp_path / "data"
    prepare_sample(data_root, vocab_size=512)
    study_dir = tmp_path / STUDY
    run_to_end(K2_VS_K3, study_dir, data_root)
    runs = mlflow_runs(study_dir, STUDY)
    assert len(runs) == 4
    client = MlflowClient(f"sqlite:///{study_dir / 'mlflow' / 'mlflow.db'}")
    opened = min(runs, key=lambda r: r.info.run_name)
    history = client.get_metric_history(opened.info.run_id, schema.METRIC_TRAIN_LOSS)
    history.sort(key=lambda m: m.step)
    assert len(history) > 1
    shots = tmp_path / "screenshots"
    shots.mkdir()
    with study_ui(study_dir) as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            experiment_id = runs[0].info.experiment_id
            check_runs_list(page, url, experiment_id, runs, shots)
            # A new user's browser: nothing chosen yet in its localStorage.
            fresh = browser.new_context(viewport=VIEWPORT).new_page()
            check_new_browser_opens_training_and_keeps_a_choice(
                fresh, url, experiment_id, len(runs), shots
            )
            check_train_loss_chart(page, opened, history, shots)
        finally:
            browser.close()
    for shot in sorted(shots.iterdir()):
        print(f"screenshot: {shot}")
