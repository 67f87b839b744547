"""The lean local MLflow tracking server that k3scale starts itself (platform.md section 4).

One server process owns the study's SQLite file, so trials in many processes never write it at
once: they talk HTTP to the server. The server runs with one uvicorn worker and without MLflow's
job executor, which keeps it near 0.5 GB and a few seconds to start.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from k3scale.errors import K3ScaleError

# platform.md section 4: server start takes about 6 s on an idle machine; 60 s covers a loaded one.
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
LOG_TAIL_LINES = 4

SERVER_ENV = {
    # platform.md section 4: no job-executor subprocesses (huey) in the lean server.
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    # platform.md section 9.
    "MLFLOW_DISABLE_TELEMETRY": "true",
}


@dataclass(frozen=True)
class StudyStore:
    """Where a study keeps its MLflow data."""

    db_path: Path
    """SQLite file of the tracking backend."""
    artifacts_dir: Path
    """Directory the server stores artifacts in (served through the server's proxy)."""
    log_path: Path
    """The server's stdout and stderr."""


def study_store(study_dir: Path) -> StudyStore:
    """The MLflow files of a study folder: `<study_dir>/mlflow/{mlflow.db, artifacts, server.log}`."""
    root = Path(study_dir).resolve() / "mlflow"
    return StudyStore(root / "mlflow.db", root / "artifacts", root / "server.log")


def sqlite_uri(db_path: Path) -> str:
    """SQLAlchemy URI of a SQLite file (absolute path, as MLflow wants)."""
    return f"sqlite:///{Path(db_path).resolve()}"


def _has_schema(db_path: Path) -> bool:
    if not db_path.exists():
        return False
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as conn:
            return conn.execute("SELECT count(*) FROM alembic_version").fetchone()[0] > 0
    except sqlite3.Error:
        return False


def ensure_schema(db_path: Path) -> None:
    """Create the MLflow tables in a SQLite file once, safely across processes.

    Two processes that open a fresh MLflow SQLite database at once both try to create the tables
    and one crashes ("table runs already exists", platform.md section 9). Call this before
    starting workers that use `sqlite:///` directly; it is a cheap no-op when the schema exists.

    Args:
        db_path: the SQLite file (created with its parent directories if missing).
    """
    db_path = Path(db_path).resolve()
    if _has_schema(db_path):
        return
    db_path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = db_path.with_name(db_path.name + ".init.lock")
    with open(lock_path, "w") as lock:
        _lock_within(lock, lock_path, SCHEMA_LOCK_WAIT_S)
        if not _has_schema(db_path):
            from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

            artifacts = db_path.parent / "artifacts"
            store = SqlAlchemyStore(sqlite_uri(db_path), artifacts.as_uri())
            store.engine.dispose()


# The kernel drops an flock when its holder dies, so only a live, stuck holder can keep it; the
# schema takes seconds to create, so two minutes means the holder is stuck.
SCHEMA_LOCK_WAIT_S = 120.0
LOCK_POLL_S = 0.1


def _lock_within(handle, path: Path, wait_s: float) -> None:
    """Take an exclusive flock on `handle`, or raise K3ScaleError after `wait_s` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise K3ScaleError(
                    f"{path} stayed locked for {wait_s:.0f} s by a process creating the MLflow "
                    "schema: end that process (fuser -v on the file names it) and run again"
                ) from None
            time.sleep(LOCK_POLL_S)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` right now (the OS picks it)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could bind `host:port` now (with SO_REUSEADDR, as uvicorn binds)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


@dataclass(frozen=True)
class LocalServer:
    """A running MLflow server started by `start_local_server`; stop it with `stop()`."""

    url: str
    """Tracking URI, e.g. http://127.0.0.1:5000."""
    pid: int
    """Pid of the `mlflow server` process; it leads its own process group (with uvicorn)."""
    log_path: Path
    """The server's stdout and stderr."""
    process: subprocess.Popen = field(repr=False, compare=False)

    def alive(self) -> bool:
        """Whether the server process is still running."""
        return self.process.poll() is None

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM the server's process group, then SIGKILL it if it has not exited in time."""
        _signal_group(self.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _signal_group(self.pid, signal.SIGKILL)
            self.process.wait(timeout=timeout_s)
        # uvicorn may outlive the CLI process for a moment; make sure the whole group is gone.
        _signal_group(self.pid, signal.SIGKILL)

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def server_command(backend_uri: str, artifacts_dir: Path, host: str, port: int) -> list[str]:
    """The `mlflow server` command line of the lean server (platform.md section 4).

    It runs MLflow's app through the `k3scale-ui` app plugin (k3scale/track/ui_app.py), whose
    UI opens on model-training pages for a browser that has not picked a view; the REST API is
    MLflow's own. Where the plugin is not registered (an editable install older than the entry
    point), the server is MLflow's plain one.
    """
    from k3scale.track import ui_app

    app = ["--app-name", ui_app.APP_NAME] if ui_app.registered() else []
    return [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        backend_uri,
        "--artifacts-destination",
        str(Path(artifacts_dir).resolve()),
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
        *app,
    ]


def start_local_server(
    backend_db: Path | str,
    artifacts_dir: Path,
    host: str = "127.0.0.1",
    port: int = 0,
    log_path: Path | None = None,
    timeout_s: float = START_TIMEOUT_S,
) -> LocalServer:
    """Start a lean MLflow server and wait until it answers.

    The server creates the SQLite schema itself (in one process, before it serves), so a single
    server on a fresh file needs no `ensure_schema`. Its security middleware accepts requests
    addressed to localhost/127.0.0.1, which is what the tracker sends.

    Args:
        backend_db: SQLite file, or any backend store URI (`sqlite:///...`, `postgresql://...`).
        artifacts_dir: directory the server stores artifacts in.
        host: interface to bind; 127.0.0.1 unless the user asks otherwise.
        port: TCP port; 0 picks a free one.
        log_path: where the server's output goes; default next to the artifacts directory.
        timeout_s: how long to wait for the server to answer (seconds).

    Returns:
        The running server; call `.stop()` (or use it as a context manager) to end it.

    Raises:
        K3ScaleError: the server exited or did not answer in time (the message holds its log tail).
    """
    backend_uri = str(backend_db) if "://" in str(backend_db) else sqlite_uri(Path(backend_db))
    if backend_uri.startswith("sqlite:///"):
        Path(backend_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    artifacts_dir = Path(artifacts_dir).resolve()
    artifacts_dir.mkdir(parents=True, exist_ok=True)
    log_path = Path(log_path) if log_path else artifacts_dir.parent / "mlflow-server.log"
    port = port or free_port(host)
    if not port_is_free(host, port):
        raise K3ScaleError(f"port {port} on {host} is in use: pick another --port (0 = any free)")
    env = {**os.environ, **SERVER_ENV}
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            server_command(backend_uri, artifacts_dir, host, port),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    url_host = f"[{host}]" if ":" in host else host
    server = LocalServer(f"http://{url_host}:{port}", process.pid, log_path, process)
    try:
        _wait_until_answering(server, timeout_s)
    except BaseException:
        server.stop()
        raise
    return server


def server_answers(url: str, timeout_s: float = 2.0) -> bool:
    """Whether an MLflow server at `url` answers its health endpoint."""
    # No proxy: a local server must not be looked up through $http_proxy.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{url}/health", timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _wait_until_answering(server: LocalServer, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not server.alive():
            raise K3ScaleError(
                f"MLflow server exited with code {server.process.returncode} while starting "
                f"(log {server.log_path}): {log_tail(server.log_path)}"
            )
        if server_answers(server.url):
            return
        time.sleep(0.2)
    raise K3ScaleError(
        f"MLflow server at {server.url} did not answer within {timeout_s:.0f} s "
        f"(log {server.log_path}): {log_tail(server.log_path)}"
    )


def log_tail(path: Path, num_lines: int = LOG_TAIL_LINES) -> str:
    """The last non-empty lines of a log file joined by " | " (one line for the CLI)."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    # Traceback underline rows (^^^^, ~~~~) carry no information.
    tail = [line.strip() for line in lines if line.strip(" ^~\t")][-num_lines:]
    return " | ".join(tail) or "(empty log)"
