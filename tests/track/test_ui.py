"""`k3scale ui`: starts the study's server, prints its URL, stops cleanly on Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from k3scale.track.server import server_answers, start_local_server, study_store
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


def test_ui_starts_the_study_server_and_stops_on_ctrl_c(tmp_path):
    experiment_id = _study_with_experiment(tmp_path, "a-study")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [
        sys.executable,
        "-m",
        "k3scale.cli",
        "ui",
        "--study-dir",
        str(tmp_path),
        "--port",
        "0",
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
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
