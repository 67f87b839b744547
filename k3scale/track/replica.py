"""The JSONL replica: every run writes what it logs to `replica.jsonl` before MLflow sees it.

One JSON object per line, each with a "type" (INTERFACES.md section 8):
`run`, `params`, `tags`, `metrics`, `status`, `artifact`, `input`, `sync`. A study can be exported and
refit from replicas alone, and `upload_replica` replays one into any MLflow server.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k3scale.errors import K3ScaleError, TrackingOutageError
from k3scale.track.schema import REPLICA_FILE, REPLICA_TYPES, TAG_REPLICA_RUN_ID


class ReplicaWriter:
    """Appends replica lines; each line reaches the OS at once, `sync()` makes them durable.

    Args:
        path: the `replica.jsonl` file.
        resume: append to an existing replica (a partial last line left by a killed process is
            cut off first); otherwise the file must not hold lines yet.
    """

    def __init__(self, path: Path, resume: bool = False):
        self.path = Path(path)
        self.num_lines = 0
        if resume:
            self.num_lines = _cut_partial_last_line(self.path)
        elif self.path.exists() and self.path.stat().st_size > 0:
            raise K3ScaleError(
                f"{self.path} already holds a run's replica: give each run its own replica "
                "directory, or resume that run"
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def write(self, entry: dict[str, Any]) -> int:
        """Append one line (flushed to the OS, so a killed process loses nothing).

        Returns:
            The 1-based line number of the new line.
        """
        assert entry["type"] in REPLICA_TYPES, entry["type"]
        self._file.write(json.dumps(entry, separators=(",", ":")) + "\n")
        self._file.flush()
        self.num_lines += 1
        return self.num_lines

    def sync(self) -> None:
        """fsync: the lines survive a machine crash, not only a process kill."""
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self.sync()
            self._file.close()


def _cut_partial_last_line(path: Path) -> int:
    """Truncate `path` after its last newline; returns the number of complete lines."""
    data = path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    if len(complete) != len(data):
        with open(path, "r+b") as file:
            file.truncate(len(complete))
    return complete.count(b"\n")


@dataclass(frozen=True)
class RunRecord:
    """Everything one replica holds about a run."""

    run_id: str
    experiment: str
    run_name: str | None
    params: dict[str, str]
    tags: dict[str, str]
    metrics: list[tuple[int, str, float]]
    """(step, key, value) in logging order."""
    status: str | None
    """`finished` | `diverged` | `failed`, or None when the run never finished (killed)."""
    start_time: int
    """ms since the epoch."""
    end_time: int | None
    """ms since the epoch, None when the run never finished."""
    metric_timestamps: list[int] = field(default_factory=list)
    """Logging time (ms) of each entry of `metrics`, same order."""
    artifacts: dict[str, Path] = field(default_factory=dict)
    """Artifact name -> local file."""
    sent_through_line: int | None = None
    """From the last `sync` line: lines 1..n reached MLflow; None if never synced."""
    unsent_lines: list[int] = field(default_factory=list)
    """From the last `sync` line: line numbers MLflow never received."""


def replica_lines(path: Path) -> list[dict[str, Any]]:
    """Parsed lines of a replica, ignoring a partial last line (a process killed mid-write).

    Raises:
        K3ScaleError: a line other than the last is not valid JSON.
    """
    text = Path(path).read_text(encoding="utf-8")
    lines = text.split("\n")
    entries = []
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if index == len(lines) - 1:
                break  # the last line has no newline: cut off when the writer was killed
            raise K3ScaleError(f"{path}:{index + 1}: corrupt replica line ({exc})") from None
    return entries


def read_replica(path: Path) -> RunRecord:
    """Rebuild a run from its replica (later tags override earlier ones).

    Args:
        path: a `replica.jsonl` file, or the directory holding one.
    """
    path = Path(path)
    if path.is_dir():
        path = path / REPLICA_FILE
    entries = replica_lines(path)
    if not entries or entries[0].get("type") != "run":
        raise K3ScaleError(f"{path}: not a k3scale replica (its first line is not a run line)")
    run = entries[0]
    params: dict[str, str] = {}
    tags: dict[str, str] = {}
    metrics: list[tuple[int, str, float]] = []
    stamps: list[int] = []
    artifacts: dict[str, Path] = {}
    status = end_time = sent_through = None
    unsent: list[int] = []
    for entry in entries[1:]:
        match entry["type"]:
            case "params":
                params.update(entry["params"])
            case "tags":
                tags.update(entry["tags"])
            case "metrics":
                for key, value in entry["values"].items():
                    metrics.append((int(entry["step"]), key, float(value)))
                    stamps.append(int(entry["timestamp"]))
            case "artifact":
                artifacts[entry["name"]] = path.parent / entry["path"]
            case "status":
                status, end_time = entry["status"], entry["end_time"]
            case "sync":
                sent_through, unsent = entry["sent_through_line"], entry.get("unsent_lines", [])
    return RunRecord(
        run_id=run["run_id"],
        experiment=run["experiment"],
        run_name=run.get("run_name"),
        params=params,
        tags=tags,
        metrics=metrics,
        status=status,
        start_time=run["start_time"],
        end_time=end_time,
        metric_timestamps=stamps,
        artifacts=artifacts,
        sent_through_line=sent_through,
        unsent_lines=unsent,
    )


def find_replicas(root: Path) -> list[Path]:
    """Every `replica.jsonl` under `root` (recursive), sorted by path."""
    return sorted(Path(root).rglob(REPLICA_FILE))


def upload_replica(record_path: Path, tracking_uri: str) -> str:
    """Replay a replica into an MLflow server; running it again adds nothing.

    The MLflow run is found by tag `k3scale.replica_run_id` (the live tracker sets it on every run
    it creates, so a run whose server came back is completed in place); if none exists a new run
    is created. Only metric points (key, step, timestamp) the run lacks are sent, and params,
    tags, artifacts and the final status likewise.

    Args:
        record_path: a `replica.jsonl` file or its directory.
        tracking_uri: the MLflow server (or `sqlite:///` store) to write into.

    Returns:
        The MLflow run id holding the replica's data.
    """
    from k3scale.track import sending

    path = Path(record_path)
    path = path / REPLICA_FILE if path.is_dir() else path
    client = sending.tracking_client(tracking_uri)
    try:
        return replay_replica(client, path)
    except Exception as exc:
        if sending.is_transient(exc):
            raise TrackingOutageError(f"MLflow at {tracking_uri} is unreachable: {exc}") from None
        raise


def replay_replica(client, path: Path) -> str:
    """`upload_replica` with an existing `MlflowClient`; returns the MLflow run id."""
    from k3scale.track import sending

    record = read_replica(path)
    experiment_id = sending.experiment_id_for(client, record.experiment)
    run = _find_uploaded_run(client, experiment_id, record.run_id)
    if run is None:
        run = client.create_run(
            experiment_id,
            start_time=record.start_time,
            tags={TAG_REPLICA_RUN_ID: record.run_id},
            run_name=record.run_name,
        )
    for send in sending.pack_sends(_missing_units(client, run, path)):
        sending.perform(client, run.info.run_id, send)
    return run.info.run_id


def _find_uploaded_run(client, experiment_id: str, replica_run_id: str):
    """The run created live by the tracker (same id) or by an earlier upload (tag), or None."""
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(replica_run_id)
        if run.info.experiment_id == experiment_id:
            return run
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
    found = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{TAG_REPLICA_RUN_ID}` = '{replica_run_id}'",
        max_results=1,
    )
    return found[0] if found else None


def _missing_units(client, run, path: Path) -> list:
    """Units of the replica that the MLflow run does not hold yet."""
    from k3scale.track import sending

    run_id, data = run.info.run_id, run.data
    logged_points = {
        (m.key, m.step, m.timestamp)
        for key in data.metrics
        for m in client.get_metric_history(run_id, key)
    }
    logged_artifacts = {a.path for a in client.list_artifacts(run_id)}
    entries = replica_lines(path)
    final_params = _final_values(entries, "params", data.params, sending.MAX_PARAM_VALUE_CHARS)
    final_tags = _final_values(entries, "tags", data.tags, sending.MAX_TAG_VALUE_CHARS)
    missing = []
    for line_no, entry in enumerate(entries, start=1):
        kind = entry["type"]
        if kind in ("params", "tags"):
            final = final_params if kind == "params" else final_tags
            kept = {k: v for k, v in entry[kind].items() if final.get(k) == (line_no, v)}
            entry = {**entry, kind: kept}
        elif kind == "metrics":
            step, stamp = entry["step"], entry["timestamp"]
            values = entry["values"].items()
            kept = {k: v for k, v in values if (k, step, stamp) not in logged_points}
            entry = {**entry, "values": kept}
        elif (kind == "artifact" and entry["name"] in logged_artifacts) or (
            kind == "status" and run.info.status != "RUNNING"
        ):
            continue  # already in MLflow (a dataset input is resent: MLflow keeps one)
        missing.extend(
            unit
            for unit in sending.units_from_line(line_no, entry, str(path.parent))
            if unit.metrics or unit.params or unit.tags or not unit.is_batch
        )
    return missing


def _final_values(
    entries: list[dict[str, Any]], kind: str, logged: dict[str, str], max_chars: int
) -> dict[str, tuple[int, str]]:
    """key -> (line that last set it, value) for the params/tags MLflow lacks or holds otherwise."""
    from k3scale.track.sending import truncate

    final: dict[str, tuple[int, str]] = {}
    for line_no, entry in enumerate(entries, start=1):
        if entry["type"] == kind:
            final.update({key: (line_no, value) for key, value in entry[kind].items()})
    return {k: (n, v) for k, (n, v) in final.items() if logged.get(k) != truncate(v, max_chars)}
