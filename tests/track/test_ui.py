"""`k3scale ui`: starts the study's server, prints its URL, stops cleanly on Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from k3scale.track import ui_app
from k3scale.track.server import server_answers, server_command, start_local_server, study_store
from tests.track.ui_server import read_line_with, read_ui_url


def _study_with_experiment(folder: Path, name: str) -> str:
    """A study folder whose MLflow store holds experiment `name`; returns its id."""
    from mlflow.tracking import MlflowClient

    (folder / "study.json").write_text(json.dumps({"study": name}))
    store = study_store(folder)
    with start_local_server(store.db_path, store.artifacts_dir, log_path=store.log_path) as server:
        return MlflowClient(server.url).create_experiment(name)


def _end(process: subprocess.Popen) -> None:
    """End a `k3scale ui` a failed check left running by SIGTERM, which it handles like Ctrl-C
    (a SIGKILL would leave its server, in a session of its own, running)."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


def _start_ui(study_dir: Path) -> subprocess.Popen:
    """`k3scale ui --study-dir DIR --port 0` as a child process (stdout and stderr piped)."""
    command = [sys.executable, "-m", "k3scale.cli", "ui", "--study-dir", str(study_dir)]
    return subprocess.Popen(
        [*command, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _get(url: str) -> tuple[int, str, str, str]:
    """Status, content type, Cache-Control and body of a GET, without $http_proxy."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=30) as reply:
        headers = reply.headers
        body = reply.read().decode()
        return reply.status, headers["Content-Type"], headers.get("Cache-Control", ""), body


def test_ui_starts_the_study_server_and_stops_on_ctrl_c(tmp_path):
    experiment_id = _study_with_experiment(tmp_path, "a-study")
    process = _start_ui(tmp_path)
    try:
        url = read_ui_url(process)
        runs_line = read_line_with(process, "runs: ")
        assert server_answers(url)
        # polars' SIGINT handler (MLflow's client imports polars) made a handled Ctrl-C end
        # this process by SIGINT at exit in about one try in ten: the command must not load it.
        loaded = Path(f"/proc/{process.pid}/maps").read_text()
        assert "polars" not in loaded, "`k3scale ui` loaded polars"
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        _end(process)
    assert process.returncode == 0, err
    assert "Traceback" not in err and "stopped" in out
    assert f"#/experiments/{experiment_id}/runs?" in runs_line
    # The model-training pages, in the k3scale runs view stored on the experiment.
    assert "workflowType=machine_learning" in runs_line and "viewStateShareKey=k3scale" in runs_line
    assert not server_answers(url), "the server outlived `k3scale ui`"
    assert (tmp_path / "mlflow" / "mlflow.db").exists()


def test_ui_rejects_artifacts_dir_without_backend_uri(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "k3scale.cli", "ui", "--artifacts-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--artifacts-dir goes with --backend-store-uri" in done.stderr


def test_ui_on_a_non_loopback_host_needs_i_know(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "k3scale.cli",
            "ui",
            "--study-dir",
            str(tmp_path),
            "--host",
            "0.0.0.0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no authentication" in lines[0] and "--i-know" in lines[0]
    assert not (tmp_path / "mlflow").exists(), "no server may start"


def test_the_ui_page_defaults_a_new_browser_to_model_training(tmp_path):
    """The server of `k3scale ui` runs MLflow's app through the k3scale-ui plugin: its index.html
    holds the script that stores the model-training choice and the k3scale runs columns once,
    and the REST API answers as MLflow's own (the path that script reads included). (Needs the entry point registered: `pip install --no-deps -e .`.)"""
    assert ui_app.registered(), "entry point mlflow.app:k3scale-ui missing: pip install -e ."
    process = _start_ui(tmp_path)
    try:
        url = read_ui_url(process)
        status, content_type, cache, page = _get(f"{url}/")
        assert status == 200 and content_type.startswith("text/html")
        assert page.count(ui_app.DEFAULT_VIEW_SCRIPT) == 1
        assert page.count("mlflow.workflowType_v1") == 2  # getItem and setItem, nothing else
        # And the runs view's columns for each experiment with the k3scale view tag.
        assert page.count(ui_app.RUNS_VIEW_SCRIPT) == 1
        assert page.count('"mlflow.sharedViewState.k3scale"') == 1
        assert page.count("-ReactComponentState") == 1
        assert page.index(ui_app.DEFAULT_VIEW_SCRIPT) < page.index("static-files/static/js/main")
        assert "no-cache" in cache  # no 304 can keep a page cached without the script
        status, content_type, _, body = _get(
            f"{url}/api/2.0/mlflow/experiments/search?max_results=1"
        )
        assert status == 200 and content_type.startswith("application/json")
        assert [e["name"] for e in json.loads(body)["experiments"]] == ["Default"]
        # The request the page's script makes (a GET, relative to the page).
        status, content_type, _, body = _get(f"{url}/{ui_app.EXPERIMENTS_URL}")
        assert status == 200 and content_type.startswith("application/json")
        assert [e["name"] for e in json.loads(body)["experiments"]] == ["Default"]
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        _end(process)
    assert process.returncode == 0, err
    assert "model-training view too" in out
    assert not server_answers(url), "the server outlived `k3scale ui`"


def test_the_server_runs_the_k3scale_ui_app_only_where_it_is_registered(monkeypatch, tmp_path):
    command = server_command("sqlite:////x/m.db", tmp_path, "127.0.0.1", 5000)
    assert command[-2:] == ["--app-name", ui_app.APP_NAME]
    monkeypatch.setattr(ui_app, "registered", lambda: False)
    command = server_command("sqlite:////x/m.db", tmp_path, "127.0.0.1", 5000)
    assert "--app-name" not in command and command[-2:] == ["--workers", "1"]


def test_the_script_goes_first_in_head_once():
    page = '<!doctype html><html><head><meta charset="utf-8"/></head><body></body></html>'
    changed = ui_app.with_default_view(page)
    assert changed.count("<script>") == 1
    assert changed.startswith("<!doctype html><html><head><script>try{")
    assert changed.replace(ui_app.DEFAULT_VIEW_SCRIPT, "") == page
