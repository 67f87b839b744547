"""`k3scale study submit` against a real local Ray cluster started with `ray start --head`.

The test starts its own one-node cluster (2 CPUs, dashboard on 127.0.0.1), submits the smoke
preset of `experiments/k2_vs_k3.py` as a Ray Job, waits for the job to succeed and checks the
study folder it left: `study.json` with 4 finished trials and one MLflow run per trial with
every tag.

`ray stop` takes no address: it kills every Ray process of the user on the machine, other
tests' clusters included. So the head runs as `ray start --head --block`, which owns its
processes and stops them all on SIGTERM; the test sends that by pid, then SIGKILLs by pid any
of the head's descendants still alive.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from k3scale.data.sample import prepare_sample
from k3scale.track import schema
from tests.sweep.test_study_runs import REQUIRED_TAGS, mlflow_runs

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
RAY = Path(sys.executable).parent / "ray"
CLUSTER_START_S = 180
# A busy 2-core machine runs the smoke study (4 trials) in a few minutes; leave ample slack.
JOB_TIMEOUT_S = 1500
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
AGENT_NOT_READY = "No available agent to submit job"


def free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cluster_env() -> dict[str, str]:
    """The venv's `k3scale` on PATH: the job's entrypoint is a shell command on the cluster."""
    path = f"{RAY.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {
        **os.environ,
        "PATH": path,
        # The test cluster runs without auth, on 127.0.0.1 only; `study submit` authenticates with
        # the caller's RAY_AUTH_* and sends none to the job, so this environment matches it.
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }


def dashboard_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/version", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def stop_cluster(head: subprocess.Popen) -> None:
    """SIGTERM the blocking `ray start` (it stops its own processes), then SIGKILL stragglers.

    Stragglers are found by pid among the head's descendants, recorded before the stop: Ray
    workers rename themselves (`ray::IDLE`), so their command lines cannot be matched.
    """
    import psutil

    descendants = psutil.Process(head.pid).children(recursive=True)
    with contextlib.suppress(ProcessLookupError):
        head.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        head.wait(timeout=60)
    _, alive = psutil.wait_procs(descendants, timeout=15)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    if alive:
        print(f"SIGKILLed {len(alive)} Ray processes left after the head stopped")


@contextlib.contextmanager
def local_ray_cluster(log_path: Path) -> Iterator[str]:
    """A one-node Ray cluster of 2 CPUs; yields its dashboard URL (the Jobs API address)."""
    # A short private temp folder: Ray's Unix socket paths must stay under ~107 characters.
    temp_dir = tempfile.mkdtemp(prefix="k3ray-", dir="/tmp")
    dashboard_port = free_port()
    command = [
        str(RAY),
        "start",
        "--head",
        "--block",
        "--node-ip-address",
        "127.0.0.1",
        "--port",
        str(free_port()),
        "--dashboard-host",
        "127.0.0.1",
        "--dashboard-port",
        str(dashboard_port),
        "--num-cpus",
        "2",
        "--include-dashboard",
        "true",
        "--temp-dir",
        temp_dir,
    ]
    url = f"http://127.0.0.1:{dashboard_port}"
    with open(log_path, "wb") as log:
        head = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=cluster_env(), start_new_session=True
        )
    try:
        deadline = time.monotonic() + CLUSTER_START_S
        while not dashboard_answers(url):
            assert head.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, f"no dashboard at {url}: {log_path.read_text()}"
            time.sleep(1.0)
        yield url
    finally:
        stop_cluster(head)
        shutil.rmtree(temp_dir, ignore_errors=True)


def submit(address: str, study_dir: Path, data_root: Path) -> str:
    command = [
        sys.executable,
        "-m",
        "k3scale.cli",
        "study",
        "submit",
        "experiments/k2_vs_k3.py",
        "--preset",
        "smoke",
        "--address",
        address,
        "--study-dir",
        str(study_dir),
        "--data-root",
        str(data_root),
        "--dataset",
        "sample",
    ]
    deadline = time.monotonic() + CLUSTER_START_S
    while True:
        done = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=cluster_env()
        )
        # The dashboard answers before the node's job agent does; Ray says to retry.
        if AGENT_NOT_READY not in done.stderr or time.monotonic() > deadline:
            break
        time.sleep(3.0)
    assert done.returncode == 0, done.stdout + done.stderr
    found = re.search(r"as Ray job (\S+)", done.stdout)
    assert found, done.stdout
    return found.group(1)


def wait_for_job(address: str, job_id: str) -> str:
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(address)
    deadline = time.monotonic() + JOB_TIMEOUT_S
    status = str(client.get_job_status(job_id).value)
    while status not in TERMINAL and time.monotonic() < deadline:
        time.sleep(5.0)
        status = str(client.get_job_status(job_id).value)
    logs = client.get_job_logs(job_id)
    assert status == "SUCCEEDED", f"job {job_id} is {status}:\n{logs[-4000:]}"
    return logs


def test_submitted_smoke_study_finishes_on_a_local_ray_cluster(tmp_path):
    data_root = tmp_path / "data"
    prepare_sample(data_root, vocab_size=512)
    study_dir = tmp_path / "k2_vs_k3"
    with local_ray_cluster(tmp_path / "ray-head.log") as address:
        started = time.monotonic()
        job_id = submit(address, study_dir, data_root)
        print(f"Ray job {job_id} submitted to {address}")
        logs = wait_for_job(address, job_id)
        took = time.monotonic() - started
    print(f"Ray job {job_id} succeeded in {took:.0f} s (submit to SUCCEEDED)")
    assert "study k2_vs_k3 done" in logs
    # The driver joined the job's cluster (RAY_ADDRESS) instead of starting a Ray of its own.
    assert "Connecting to existing Ray cluster" in logs
    record = json.loads((study_dir / "study.json").read_text())
    # smoke: 2 cells (k2-t0, k3-t0) x 2 trials, one budget, cosine only.
    assert record["trials"] == {"finished": 4, "failed": 0, "diverged": 0}
    runs = mlflow_runs(study_dir, "k2_vs_k3")
    assert len(runs) == 4
    assert {r.data.tags[schema.TAG_STATUS] for r in runs} == {schema.STATUS_FINISHED}
    assert {r.data.tags[schema.TAG_ARCH] for r in runs} == {"k2", "k3"}
    for run in runs:
        missing = [tag for tag in REQUIRED_TAGS if tag not in run.data.tags]
        assert not missing, missing
        assert run.data.tags[schema.TAG_STUDY] == "k2_vs_k3"
        assert "final/val_ood_loss" in run.data.metrics
