"""Cluster parts on one machine for the rehearsal (issue 22): an MLflow server with basic auth
on a PostgreSQL backend, and a Ray cluster of a head and worker nodes with token auth, each a
process of its own on 127.0.0.1 that can be stopped, restarted or killed by pid.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from k3scale.errors import K3ScaleError
from k3scale.sweep.reaper import process_table
from k3scale.track.server import free_port, server_answers

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
START_TIMEOUT_S = 180.0
STUDY_USER = "k3scale-study"


def descendant_pids(pid: int) -> set[int]:
    """Every live descendant of `pid` (from /proc: Ray's workers rename themselves, so only
    the process tree says whose they are)."""
    children: dict[int, list[int]] = {}
    for child, (parent, _) in process_table().items():
        children.setdefault(parent, []).append(child)
    found, stack = set(), [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def kill_tree(pid: int) -> list[int]:
    """SIGKILL a process and all its descendants (found first). Returns the pids signalled."""
    pids = [pid, *descendant_pids(pid)]
    for target in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(target, signal.SIGKILL)
    deadline = time.monotonic() + 15.0
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return pids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"  # a zombie is dead, waiting for its parent


def wait_for(what: str, ready: Callable[[], bool], timeout_s: float, poll_s: float = 1.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise K3ScaleError(f"rehearsal: {what} not within {timeout_s:.0f} s")
        time.sleep(poll_s)


def http_status(url: str, *, auth: tuple[str, str] | None = None, body: dict | None = None) -> int:
    """Status code of a GET (or a JSON POST) to `url`, with basic auth if given."""
    request = urllib.request.Request(url, data=json.dumps(body).encode() if body else None)
    if body is not None:
        request.add_header("Content-Type", "application/json")
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


class AuthMlflow:
    """`mlflow server --app-name basic-auth` on a PostgreSQL backend, stoppable and restartable
    on the same port."""

    def __init__(self, folder: Path, backend: str, artifacts: Path) -> None:
        self.folder, self.backend, self.artifacts = folder, backend, artifacts
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin = ("admin", secrets.token_urlsafe(16))
        self.user = (STUDY_USER, secrets.token_urlsafe(16))
        self.csrf_key = secrets.token_hex(16)  # the same across restarts, as replicas need
        self.config = folder / "basic_auth.ini"
        self.config.write_text(
            textwrap.dedent(f"""\
                [mlflow]
                default_permission = READ
                database_uri = sqlite:///{folder / "basic_auth.db"}
                admin_username = {self.admin[0]}
                authorization_function = mlflow.server.auth:authenticate_request_basic_auth
                """)
        )
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        env = {
            **os.environ,
            "MLFLOW_AUTH_CONFIG_PATH": str(self.config),
            # Read only on the first start, when the user store is empty.
            "MLFLOW_AUTH_ADMIN_PASSWORD": self.admin[1],
            "MLFLOW_FLASK_SERVER_SECRET_KEY": self.csrf_key,
            "MLFLOW_DISABLE_TELEMETRY": "true",
        }
        command = [
            str(BIN / "mlflow"), "server",
            "--app-name", "basic-auth",
            "--backend-store-uri", self.backend,
            "--artifacts-destination", str(self.artifacts),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--workers", "1",
        ]  # fmt: skip
        self.starts += 1
        with open(self.folder / f"mlflow-{self.starts}.log", "wb") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        wait_for(
            f"the MLflow server on port {self.port}",
            lambda: self.process.poll() is None and server_answers(self.url),
            START_TIMEOUT_S,
        )

    def create_user(self) -> None:
        status = http_status(
            f"{self.url}/api/2.0/mlflow/users/create",
            auth=self.admin,
            body={"username": self.user[0], "password": self.user[1]},
        )
        if status != 200:
            raise K3ScaleError(f"rehearsal: MLflow refused to create the study's user ({status})")

    def credentials(self) -> dict[str, str]:
        """The study user's credentials as MLflow's client reads them from the environment."""
        return {
            "MLFLOW_TRACKING_USERNAME": self.user[0],
            "MLFLOW_TRACKING_PASSWORD": self.user[1],
        }

    def stop(self) -> None:
        if self.process is not None:
            kill_tree(self.process.pid)
            self.process = None

    def refusals(self) -> dict[str, int]:
        """Status codes of an experiment search without and with wrong credentials."""
        search = f"{self.url}/api/2.0/mlflow/experiments/search?max_results=1"
        return {
            "no_credentials": http_status(search),
            "wrong_password": http_status(search, auth=(self.user[0], "not-the-password")),
            "study_user": http_status(search, auth=self.user),
        }


@dataclass
class RayNode:
    name: str
    process: subprocess.Popen
    log: Path


@dataclass
class RayCluster:
    """A head and worker nodes on 127.0.0.1, each a `ray start --block` process, token auth."""

    folder: Path
    workers: int
    nodes: list[RayNode] = field(default_factory=list)

    def __post_init__(self) -> None:
        # A short private temp folder: Ray's Unix socket paths must stay under ~107 characters.
        self.temp_dir = tempfile.mkdtemp(prefix="k3reh-", dir="/tmp")
        self.gcs_port = free_port()
        self.dashboard_port = free_port()
        self.dashboard = f"http://127.0.0.1:{self.dashboard_port}"
        self.token = self.folder / "ray_token"
        fd = os.open(self.token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32))

    def env(self) -> dict[str, str]:
        """Token auth on; the venv's `k3scale` on PATH (the job's entrypoint is a shell line)."""
        return {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.token),
            "RAY_USAGE_STATS_ENABLED": "0",
            "MLFLOW_DISABLE_TELEMETRY": "true",
        }

    def start(self) -> None:
        head = [
            "--head",
            "--port", str(self.gcs_port),
            "--dashboard-host", "127.0.0.1",
            "--dashboard-port", str(self.dashboard_port),
            "--include-dashboard", "true",
            "--num-cpus", "0",
            "--ray-client-server-port", str(free_port()),
        ]  # fmt: skip
        self._start_node("head", head)
        wait_for(
            f"the Ray dashboard at {self.dashboard}",
            lambda: http_status(f"{self.dashboard}/api/version") in (200, 401, 403),
            START_TIMEOUT_S,
        )
        for index in range(1, self.workers + 1):
            self._start_node(f"worker{index}", self._worker_role())
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.workers_up() < self.workers:
            # A worker whose `ray start` gave up (the GCS not ready yet, a port taken between
            # choosing and binding it) is started again, on fresh ports.
            for i, node in enumerate(self.nodes[1:], start=1):
                if node.process.poll() is not None and time.monotonic() < deadline:
                    self.nodes[i] = self._start_node(node.name, self._worker_role(), keep=False)
            if time.monotonic() > deadline:
                tails = "; ".join(f"{n.name}: {n.log.read_text()[-400:]}" for n in self.nodes[1:])
                raise K3ScaleError(f"rehearsal: Ray worker nodes did not start: {tails}")
            time.sleep(1.0)

    def _worker_role(self) -> list[str]:
        return ["--address", f"127.0.0.1:{self.gcs_port}", "--num-cpus", "1"]

    def _start_node(self, name: str, role: list[str], keep: bool = True) -> RayNode:
        # Several nodes on one machine: every port a node opens is its own.
        ports = [
            "--node-manager-port", str(free_port()),
            "--object-manager-port", str(free_port()),
            "--dashboard-agent-listen-port", str(free_port()),
            "--dashboard-agent-grpc-port", str(free_port()),
            "--runtime-env-agent-port", str(free_port()),
            "--metrics-export-port", str(free_port()),
        ]  # fmt: skip
        command = [
            str(BIN / "ray"), "start", "--block",
            "--node-ip-address", "127.0.0.1",
            "--temp-dir", self.temp_dir,
            "--object-store-memory", str(200 * 2**20),
            *role, *ports,
        ]  # fmt: skip
        log = self.folder / f"ray-{name}.log"
        with open(log, "ab") as out:
            process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env(),
                start_new_session=True,
            )
        node = RayNode(name, process, log)
        if keep:
            self.nodes.append(node)
        return node

    def workers_up(self) -> int:
        """Worker nodes whose `ray start` said the node is up (and still runs)."""
        return sum(
            node.process.poll() is None and "Ray runtime started" in node.log.read_text()
            for node in self.nodes[1:]
        )

    def node_of(self, pid: int) -> RayNode | None:
        """The worker node whose process tree holds `pid` (a trial's Ray worker)."""
        for node in self.nodes[1:]:
            if node.process.poll() is None and pid in descendant_pids(node.process.pid):
                return node
        return None

    def kill(self, node: RayNode) -> list[int]:
        return kill_tree(node.process.pid)

    def stop(self) -> None:
        for node in reversed(self.nodes):
            if node.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    node.process.send_signal(signal.SIGTERM)
        for node in reversed(self.nodes):
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.process.wait(timeout=60)
            kill_tree(node.process.pid)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def refusal_without_token(self, study_file: Path) -> dict:
        """What a client without the token gets: the Jobs API over plain HTTP (status code), and
        `k3scale study submit` (exit code and its one line)."""
        # A client with no Ray auth settings at all: it sends no token.
        env = {k: v for k, v in self.env().items() if not k.startswith("RAY_AUTH")}
        command = [
            sys.executable, "-m", "k3scale.cli", "study", "submit", str(study_file),
            "--preset", "smoke", "--address", self.dashboard, "--data-root", "/nonexistent",
        ]  # fmt: skip
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
        return {
            "jobs_api_status": http_status(f"{self.dashboard}/api/jobs/"),
            "submit_exit": done.returncode,
            "submit_said": (done.stderr.strip().splitlines() or [""])[-1][:300],
        }


@contextlib.contextmanager
def environment(env: dict[str, str]):
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
