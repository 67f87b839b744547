"""The study's MLflow service as the driver sees it: start, keep up, recover.

Local default: a lean server on 127.0.0.1 over the study folder's SQLite database, reused if a
killed driver left it running, restarted (same database) if it dies mid-study. With a team's
`--tracking-uri` the driver pauses until the server answers again. Trials never lose data while
the server is away: each run writes its JSONL replica first, and `recover` replays every replica
whose run was not completely sent once the server is back.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from urllib.parse import urlsplit

from k3scale.errors import K3ScaleError

# How long a driver waits for an external tracking server before giving up (seconds).
EXTERNAL_WAIT_S = 1800.0


class TrackingService:
    """The MLflow server of one study run."""

    def __init__(self, folder: Path, external_uri: str | None, log=print) -> None:
        if external_uri and urlsplit(external_uri).scheme not in ("http", "https"):
            raise K3ScaleError(
                f"--tracking-uri {external_uri}: expected the http(s) URL of an MLflow server"
            )
        self.folder = folder
        self.external_uri = external_uri
        self.log = log
        self.url = external_uri or ""
        self.pid: int | None = None
        self.started = False
        """Whether this service started the local server (rather than reusing one)."""

    @property
    def _record(self) -> Path:
        from k3scale.track.server import study_store

        return study_store(self.folder).db_path.parent / "server.json"

    def start(self) -> str:
        """Connect to the external server, or reuse / start the local one; returns its URL."""
        from k3scale.track.server import server_answers

        if self.external_uri:
            if not server_answers(self.external_uri):
                raise K3ScaleError(f"MLflow server at {self.external_uri} is unreachable")
            return self.url
        previous = json.loads(self._record.read_text()) if self._record.exists() else None
        if previous and _pid_alive(previous["pid"]) and server_answers(previous["url"]):
            self.log(
                f"MLflow server {previous['url']} (pid {previous['pid']}) left by a previous driver: reusing it"
            )
            self.url, self.pid = previous["url"], previous["pid"]
            return self.url
        return self._start_local()

    def _start_local(self) -> str:
        from k3scale.track.server import ensure_schema, start_local_server, study_store

        store = study_store(self.folder)
        ensure_schema(store.db_path)
        server = start_local_server(store.db_path, store.artifacts_dir, log_path=store.log_path)
        self.url, self.pid, self.started = server.url, server.pid, True
        tmp = self._record.with_suffix(".tmp")
        tmp.write_text(json.dumps({"url": self.url, "pid": self.pid}))
        os.replace(tmp, self._record)
        self.log(f"MLflow server {self.url} (pid {self.pid}) on {store.db_path}")
        return self.url

    def ensure_up(self) -> str:
        """The URL of a server that answers now: restart the local one, or wait for a team's."""
        from k3scale.track.server import server_answers

        if server_answers(self.url):
            return self.url
        if not self.external_uri:
            self.log(
                f"MLflow server {self.url} stopped answering: restarting it on the same database"
            )
            self.stop()
            return self._start_local()
        deadline = time.time() + EXTERNAL_WAIT_S
        while time.time() < deadline:
            self.log(f"MLflow server {self.url} is unreachable: study paused, retrying in 30 s")
            time.sleep(30)
            if server_answers(self.url):
                return self.url
        raise K3ScaleError(f"MLflow server {self.url} unreachable for {EXTERNAL_WAIT_S:.0f} s")

    def recover(self, runs_root: Path) -> int:
        """Replay into MLflow every replica with lines the server never got; returns how many."""
        from k3scale.track.replica import find_replicas, read_replica, upload_replica

        recovered = 0
        for path in find_replicas(runs_root):
            record = read_replica(path)
            if record.unsent_lines or record.sent_through_line is None or record.status is None:
                upload_replica(path, self.url)
                recovered += 1
        if recovered:
            self.log(f"replayed {recovered} run replicas into MLflow (runs the server missed)")
        return recovered

    def close_orphans(self, experiment: str) -> int:
        """Mark failed every run of the experiment still RUNNING once no trial is in flight.

        Such a run was left by a process that died without ending it (a worker that raised, a
        killed driver whose trial was not resumed); left open it reads as still training.
        Returns how many were closed.
        """
        from mlflow.tracking import MlflowClient

        from k3scale.track import schema

        client = MlflowClient(self.url)
        found = client.get_experiment_by_name(experiment)
        if found is None:
            return 0
        orphans = client.search_runs(
            [found.experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=1000
        )
        for run in orphans:
            client.set_tag(run.info.run_id, schema.TAG_STATUS, schema.STATUS_FAILED)
            client.set_terminated(run.info.run_id, status="FAILED")
        if orphans:
            self.log(f"closed {len(orphans)} MLflow runs left RUNNING by dead processes as failed")
        return len(orphans)

    def stop(self) -> None:
        """Stop the local server this driver uses (never an external one)."""
        if self.external_uri or self.pid is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)
            time.sleep(0.5)
        self.pid = None


def summary_experiment(study_name: str) -> str:
    """The experiment of a study's summary run. It sits beside the study's experiment because
    every run in that one becomes a row of the exported run tables."""
    return f"{study_name}/summary"


def log_study_summary(
    folder: Path, study_name: str, preset: str, tracking_uri: str | None = None, log=print
) -> str | None:
    """Log the study's fit.json and dashboard.html (those that exist) as artifacts of its one
    summary run, tagged `k3scale.study_summary=<preset>`; a second call updates the same run.

    Args:
        folder: the study folder.
        tracking_uri: a team's server; None uses (or briefly starts) the folder's local one.

    Returns:
        The summary run's id, or None when neither file exists.
    """
    from mlflow.tracking import MlflowClient

    from k3scale.track.schema import TAG_STUDY, TAG_STUDY_SUMMARY
    from k3scale.track.sending import experiment_id_for

    files = [path for path in (folder / "fit.json", folder / "dashboard.html") if path.exists()]
    if not files:
        return None
    service = TrackingService(folder, tracking_uri, log)
    try:
        client = MlflowClient(service.start())
        experiment_id = experiment_id_for(client, summary_experiment(study_name))
        found = client.search_runs(
            [experiment_id], filter_string=f"tags.`{TAG_STUDY_SUMMARY}` = '{preset}'", max_results=1
        )
        tags = {TAG_STUDY_SUMMARY: preset, TAG_STUDY: study_name}
        run = found[0] if found else client.create_run(experiment_id, tags=tags, run_name=preset)
        for path in files:
            client.log_artifact(run.info.run_id, str(path))
        client.set_terminated(run.info.run_id)
    finally:
        if service.started:
            service.stop()
    return run.info.run_id


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
