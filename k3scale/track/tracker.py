"""`RunTracker`: one training run's params, tags, metrics and artifacts, to the replica and MLflow.

Every record goes to the JSONL replica first, then to MLflow. Metrics are buffered and sent with
one `log_batch` per `flush()` (platform.md section 4). When the server drops mid-run training
keeps going: unsent records stay queued and are retried on later flushes with a growing pause,
and `finish()` writes a `sync` line naming what never reached MLflow (`upload_replica` can
replay it later).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from pathlib import Path
from typing import Any

from k3scale.errors import K3ScaleError, TrackingUnreachableError
from k3scale.track import sending
from k3scale.track.provenance import provenance
from k3scale.track.replica import ReplicaWriter, read_replica, replay_replica
from k3scale.track.schema import REPLICA_FILE, STATUSES, TAG_REPLICA_RUN_ID, TAG_STATUS

__all__ = ["RunTracker", "flatten_params", "provenance"]

log = logging.getLogger(__name__)

# Pause before retrying an unreachable server, doubling per failure up to the cap (seconds).
RETRY_FIRST_PAUSE_S = 2.0
RETRY_MAX_PAUSE_S = 120.0
# Memory bound on records queued for an unreachable server; older ones stay in the replica only.
MAX_QUEUED_METRIC_POINTS = 200_000
ARTIFACTS_SUBDIR = "artifacts"
# mlflow/utils/validation.py (mlflow 3.17.2) MAX_DATASET_DIGEST_SIZE; the full fingerprint is
# the k3scale.data_fingerprint tag.
MAX_DATASET_DIGEST_CHARS = 36


def flatten_params(params: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested dicts -> dotted keys, every value as a string (as MLflow stores params)."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        if isinstance(value, dict):
            flat.update(flatten_params(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = str(value)
    return flat


def _now_ms() -> int:
    return int(time.time() * 1000)


class RunTracker:
    """Tracks one run in MLflow (or only in the replica when `tracking_uri` is None).

    Args:
        tracking_uri: MLflow server URL (or `sqlite:///` store); None writes only the replica.
        experiment: MLflow experiment name (created if missing), one per study.
        run_name: human-readable name; identity lives in params and tags.
        tags: run tags (the trainer adds `provenance()` tags here).
        params: resolved config; nested dicts are flattened to dotted keys.
        replica_dir: this run's own directory; the replica is `replica_dir/replica.jsonl`.
        run_id: resume this run: append to its replica in `replica_dir` and continue its MLflow
            run (completed from the replica first, or recreated if the server lost it).

    Raises:
        K3ScaleError: the MLflow server is unreachable, `replica_dir` already holds a run (when
            not resuming), or the replica to resume is missing or belongs to another run.
    """

    def __init__(
        self,
        tracking_uri: str | None,
        experiment: str,
        run_name: str | None,
        tags: dict[str, str],
        params: dict[str, Any],
        replica_dir: Path,
        run_id: str | None = None,
    ):
        self.tracking_uri = tracking_uri
        self.replica_dir = Path(replica_dir)
        self._client = sending.tracking_client(tracking_uri) if tracking_uri else None
        self._queue: list[sending.Unit] = []
        self._given_up: set[int] = set()
        self._retry_after = 0.0
        self._retry_pause_s = RETRY_FIRST_PAUSE_S
        self._closed = False
        # Last step logged per metric key: a run resumed from a checkpoint older than its last
        # logged step replays those steps, and must not log them twice (issue 23).
        self._logged_through: dict[str, int] = {}
        if run_id is None:
            self._start(experiment, run_name, tags)
        else:
            self._resume(run_id)
        self._record({"type": "params", "params": flatten_params(params)})
        self._record({"type": "tags", "tags": {k: str(v) for k, v in tags.items()}})
        self.flush()

    def _start(self, experiment: str, run_name: str | None, tags: dict[str, str]) -> None:
        if self.replica_path.exists():
            raise K3ScaleError(
                f"{self.replica_path} already exists: each run needs its own replica directory "
                "(pass run_id to resume that run)"
            )
        start_time = _now_ms()
        if self._client is None:
            self.run_id = uuid.uuid4().hex
        else:
            experiment_id = self._call_at_start(sending.experiment_id_for, self._client, experiment)
            # The tags go with the run's creation: should the server die before the first flush,
            # the run it leaves behind still says which trial and attempt it was (issue 22).
            run = self._call_at_start(
                self._client.create_run,
                experiment_id,
                start_time=start_time,
                tags={k: str(v) for k, v in tags.items()},
                run_name=run_name,
            )
            self.run_id = run.info.run_id
        self.mlflow_run_id = self.run_id if self._client else None
        self._replica = ReplicaWriter(self.replica_path)
        self._replica.write(
            {
                "type": "run",
                "run_id": self.run_id,
                "experiment": experiment,
                "run_name": run_name,
                "start_time": start_time,
            }
        )
        self._record({"type": "tags", "tags": {TAG_REPLICA_RUN_ID: self.run_id}})

    def _resume(self, run_id: str) -> None:
        if not self.replica_path.exists():
            raise K3ScaleError(f"cannot resume run {run_id}: no replica at {self.replica_path}")
        found = read_replica(self.replica_path).run_id
        if found != run_id:
            raise K3ScaleError(f"cannot resume run {run_id}: {self.replica_path} is run {found}")
        self.run_id = run_id
        for step, key, _ in read_replica(self.replica_path).metrics:
            self._logged_through[key] = max(step, self._logged_through.get(key, step))
        self._replica = ReplicaWriter(self.replica_path, resume=True)
        self.mlflow_run_id = None
        if self._client is not None:
            self.mlflow_run_id = self._call_at_start(
                replay_replica, self._client, self.replica_path
            )
            self._call_at_start(self._client.update_run, self.mlflow_run_id, status="RUNNING")

    def _call_at_start(self, fn, *args, **kwargs):
        """An MLflow call before training starts: an unreachable server is a clear error."""
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if not sending.is_transient(exc):
                raise
            raise TrackingUnreachableError(
                f"MLflow server at {self.tracking_uri} is unreachable: start it with "
                f"`k3scale ui` or pass --tracking-uri ({type(exc).__name__})"
            ) from None

    @property
    def replica_path(self) -> Path:
        return self.replica_dir / REPLICA_FILE

    def _record(self, entry: dict[str, Any]) -> None:
        """Write a line to the replica, and queue it for MLflow when there is a server."""
        line_no = self._replica.write(entry)
        if self._client is not None:
            self._queue.extend(sending.units_from_line(line_no, entry, str(self.replica_dir)))

    def log_metrics(self, step: int, values: dict[str, float]) -> None:
        """Buffer metric values of optimizer step `step` (sent at the next `flush()`).

        A resumed run's values at steps its replica already holds are dropped (they were logged
        before the process died).

        Args:
            step: optimizer step (MLflow step).
            values: metric name -> value (names from `k3scale.track.schema`).
        """
        values = {k: v for k, v in values.items() if step > self._logged_through.get(k, -1)}
        if not values:
            return
        entry = {"type": "metrics", "step": int(step), "timestamp": _now_ms()}
        self._record({**entry, "values": {k: float(v) for k, v in values.items()}})
        if self._queued_points() > MAX_QUEUED_METRIC_POINTS:
            self.flush()
            if self._queued_points() > MAX_QUEUED_METRIC_POINTS:
                self._give_up_oldest()

    def set_tags(self, tags: dict[str, str]) -> None:
        """Add or overwrite run tags (sent at the next `flush()`)."""
        self._record({"type": "tags", "tags": {k: str(v) for k, v in tags.items()}})

    def log_dataset(self, name: str, digest: str, source: str, context: str = "training") -> None:
        """Record the run's dataset as an MLflow dataset input (the UI's Dataset column).

        Args:
            name: dataset name.
            digest: data fingerprint; MLflow keeps at most MAX_DATASET_DIGEST_CHARS of it.
            source: where the data lies (a folder path).
            context: the dataset's role in the run.
        """
        dataset = {
            "name": name,
            "digest": digest[:MAX_DATASET_DIGEST_CHARS],
            "source_type": "local",
            # What MLflow's own local sources store (LocalArtifactDatasetSource.to_json).
            "source": json.dumps({"uri": source}),
            "context": context,
        }
        self._record({"type": "input", "dataset": dataset})

    def log_artifact_json(self, name: str, obj: Any) -> Path:
        """Save `obj` as JSON file `name` in the replica directory and log it as an artifact.

        Returns:
            The local file.
        """
        path = self.replica_dir / ARTIFACTS_SUBDIR / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        relative = str(path.relative_to(self.replica_dir))
        self._record({"type": "artifact", "name": name, "path": relative})
        return path

    def flush(self, force: bool = False) -> None:
        """Make the replica durable, then send queued records to MLflow in few `log_batch` calls.

        While the server is unreachable this returns at once until the retry pause has passed
        (or `force`), so training is never held up for long.
        """
        self._replica.sync()
        if not self._queue or (not force and time.monotonic() < self._retry_after):
            return
        sends = sending.pack_sends(self._queue)
        for index, send in enumerate(sends):
            if not self._perform(send):
                self._queue = [unit for later in sends[index:] for unit in later.units]
                return
        self._queue = []

    def _perform(self, send: sending.Send) -> bool:
        """One MLflow call; False when the server is unreachable (`send` stays queued)."""
        try:
            sending.perform(self._client, self.mlflow_run_id, send)
        except Exception as exc:
            transient = sending.is_transient(exc)
            if transient is None:
                raise
            if transient:
                self._pause_sending(exc)
                return False
            log.warning("MLflow rejected replica lines %s: %s", sorted(send.lines), exc)
            self._given_up |= send.lines
        if self._retry_pause_s > RETRY_FIRST_PAUSE_S:
            log.warning("MLflow at %s answers again; sending queued records", self.tracking_uri)
        self._retry_pause_s = RETRY_FIRST_PAUSE_S
        return True

    def _pause_sending(self, exc: Exception) -> None:
        if self._retry_pause_s == RETRY_FIRST_PAUSE_S:
            log.warning(
                "MLflow at %s is unreachable (%s); training continues, records stay in %s and "
                "are retried",
                self.tracking_uri,
                exc,
                self.replica_path,
            )
        self._retry_after = time.monotonic() + self._retry_pause_s
        self._retry_pause_s = min(2 * self._retry_pause_s, RETRY_MAX_PAUSE_S)

    def _queued_points(self) -> int:
        # Cheap while the server answers (the queue empties at every flush).
        return sum(len(unit.metrics) for unit in self._queue)

    def _give_up_oldest(self) -> None:
        """Drop the older half of queued metric points from memory (they stay in the replica)."""
        metric_units = [unit for unit in self._queue if unit.metrics]
        dropped = metric_units[: len(metric_units) // 2]
        self._given_up |= {unit.line for unit in dropped}
        dropped_ids = set(map(id, dropped))
        self._queue = [unit for unit in self._queue if id(unit) not in dropped_ids]

    def finish(self, status: str) -> None:
        """End the run: tag `k3scale.status`, set the MLflow run status, record what was sent.

        Args:
            status: `finished`, `diverged` (MLflow FINISHED) or `failed` (MLflow FAILED).
        """
        if status not in STATUSES:
            raise ValueError(f"status: {status!r} is not one of {STATUSES}")
        if self._closed:
            return
        self.set_tags({TAG_STATUS: status})
        self._record({"type": "status", "status": status, "end_time": _now_ms()})
        self.close()

    def close(self) -> None:
        """Send what is queued and close the replica, leaving the run open (resumable)."""
        if self._closed:
            return
        self._closed = True
        self.flush(force=True)
        if self._client is not None:
            unsent = sorted(self._given_up | {unit.line for unit in self._queue})
            sent_through = (unsent[0] - 1) if unsent else self._replica.num_lines
            self._replica.write(
                {"type": "sync", "sent_through_line": sent_through, "unsent_lines": unsent}
            )
            if unsent:
                log.warning(
                    "%d replica lines never reached MLflow; replay them with upload_replica(%s)",
                    len(unsent),
                    self.replica_path,
                )
        self._replica.close()

    def __enter__(self) -> RunTracker:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.finish("failed" if exc_type is not None else "finished")


def abandon_attempt(replica_dir: Path, tracking_uri: str | None) -> Path | None:
    """Set aside the replica of an attempt that died before its first checkpoint.

    The replica is renamed (never deleted: what it logged stays on disk) and its MLflow run, if
    any, is marked failed, so the retry starts a clean run in the same folder.
    """
    replica = Path(replica_dir) / REPLICA_FILE
    if not replica.exists():
        return None
    run_id = read_replica(replica).run_id
    index = 1
    while (target := replica.with_name(f"replica.abandoned-{index}.jsonl")).exists():
        index += 1
    replica.rename(target)
    if tracking_uri:
        try:
            client = sending.tracking_client(tracking_uri)
            client.set_tag(run_id, TAG_STATUS, "failed")
            client.set_terminated(run_id, status="FAILED")
        except Exception as exc:  # the retry must not fail because the old run is unreachable
            log.warning("could not mark abandoned run %s failed: %s", run_id, exc)
    return target
