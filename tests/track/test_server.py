"""The lean local server: schema creation, start errors, stop by pid."""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import sys
import urllib.request

import pytest

from k3scale.errors import K3ScaleError
from k3scale.track.server import (
    ensure_schema,
    server_answers,
    start_local_server,
    study_store,
)


def _tables(db_path) -> set[str]:
    with sqlite3.connect(db_path) as conn:
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def test_ensure_schema_creates_the_tables_once(tmp_path):
    db = tmp_path / "study" / "mlflow.db"
    ensure_schema(db)
    assert {"experiments", "runs", "metrics", "params", "alembic_version"} <= _tables(db)
    before = db.stat().st_mtime_ns
    ensure_schema(db)
    assert db.stat().st_mtime_ns == before, "an existing schema is left alone"


@pytest.mark.slow
def test_ensure_schema_is_safe_from_two_processes_at_once(tmp_path):
    """Two fresh-DB creators at once crash MLflow ("table runs already exists") without the lock."""
    db = tmp_path / "study" / "mlflow.db"
    code = "import sys; from k3scale.track.server import ensure_schema; ensure_schema(sys.argv[1])"
    workers = [
        subprocess.Popen([sys.executable, "-c", code, str(db)], stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    for worker in workers:
        _, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
    assert {"experiments", "runs", "metrics", "params", "alembic_version"} <= _tables(db)
    ensure_schema(db)  # a second call is a no-op on an existing schema
    assert {"runs"} <= _tables(db)


def test_session_server_answers_the_tracking_api(mlflow_local_server):
    server = mlflow_local_server
    assert server.url.startswith("http://127.0.0.1:") and server.alive()
    request = urllib.request.Request(
        f"{server.url}/api/2.0/mlflow/experiments/search",
        # By name: other tests of the session add experiments that would push Default off a page.
        data=json.dumps({"max_results": 5, "filter": "name = 'Default'"}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert b"Default" in response.read()


def test_busy_port_is_a_clear_error(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(K3ScaleError, match=f"port {port} on 127.0.0.1 is in use"):
            start_local_server(tmp_path / "m.db", tmp_path / "artifacts", port=port)


@pytest.mark.slow
def test_server_that_cannot_start_reports_its_log(tmp_path):
    with pytest.raises(K3ScaleError, match=r"exited with code .* \(log .*\): .*"):
        start_local_server("nosuchdb://nowhere", tmp_path / "artifacts", timeout_s=90)


@pytest.mark.slow
def test_stop_ends_the_whole_process_group(tmp_path):
    store = study_store(tmp_path)
    server = start_local_server(
        store.db_path, store.artifacts_dir, log_path=store.log_path, timeout_s=120
    )
    server.stop()
    assert not server.alive() and not server_answers(server.url)
    done = subprocess.run(
        ["ps", "-o", "pid=", "-g", str(server.pid)], capture_output=True, text=True
    )
    assert done.stdout.strip() == "", "uvicorn outlived the mlflow CLI process"
    assert store.db_path.exists() and "Uvicorn running" in store.log_path.read_text()
