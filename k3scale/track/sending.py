"""Turning replica lines into MLflow calls: units, batches within MLflow's limits, errors.

Shared by the live tracker and `upload_replica`. A replica line becomes one or more *units*
(a params line with 250 keys is three units of at most 100); consecutive units are packed into as
few `log_batch` calls as MLflow's limits allow. A line counts as sent once all its units are.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from k3scale.errors import K3ScaleError
from k3scale.track import schema
from k3scale.track.schema import MLFLOW_DATASET_CONTEXT, STATUS_FAILED

# mlflow/utils/validation.py (mlflow 3.17.2): MAX_PARAMS_TAGS_PER_BATCH, MAX_METRICS_PER_BATCH,
# MAX_ENTITIES_PER_BATCH, MAX_PARAM_VAL_LENGTH, MAX_TAG_VAL_LENGTH.
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000
MAX_ENTITIES_PER_BATCH = 1000
MAX_PARAM_VALUE_CHARS = 6000
MAX_TAG_VALUE_CHARS = 8000
TRUNCATION_MARK = "...[truncated]"

# Short HTTP settings so a dead server costs a training loop seconds, not minutes (MLflow's
# defaults are 7 retries with backoff 2 and a 120 s timeout). The tracker retries on its own.
HTTP_CLIENT_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
    # set_terminated otherwise prints a "View run" link, costing one more request per run.
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}

# MLflow's own client variables for a server with authentication (basic auth, or a bearer token);
# every MlflowClient reads them per request.
CREDENTIAL_VARS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")
# HTTP statuses of a server that refuses the caller: no or wrong credentials, too few permissions.
REFUSED_STATUSES = (401, 403)

MLFLOW_RUN_STATUS = {STATUS_FAILED: "FAILED"}
"""k3scale status -> MLflow RunStatus; `finished` and `diverged` runs are MLflow FINISHED."""


@dataclass(frozen=True)
class Unit:
    """One MLflow call's worth (or less) of one replica line."""

    line: int
    """1-based replica line number this unit came from."""
    metrics: tuple[tuple[str, float, int, int], ...] = ()
    """(key, value, timestamp ms, step) points."""
    params: tuple[tuple[str, str], ...] = ()
    tags: tuple[tuple[str, str], ...] = ()
    artifact_path: str | None = None
    """Local file to upload as a run artifact."""
    status: str | None = None
    """k3scale status that terminates the run."""
    end_time: int | None = None
    """Run end time (ms since the epoch) for a status unit."""
    dataset: tuple[tuple[str, str], ...] = ()
    """(field, value) of a dataset input: name, digest, source_type, source, context."""

    @property
    def is_batch(self) -> bool:
        return self.artifact_path is None and self.status is None and not self.dataset


@dataclass
class Send:
    """One MLflow call: a `log_batch`, an artifact upload or a run termination."""

    units: list[Unit] = field(default_factory=list)
    num_metrics: int = 0
    param_keys: set[str] = field(default_factory=set)
    tag_keys: set[str] = field(default_factory=set)

    @property
    def lines(self) -> set[int]:
        return {unit.line for unit in self.units}

    def add(self, unit: Unit) -> None:
        self.units.append(unit)
        self.num_metrics += len(unit.metrics)
        self.param_keys.update(key for key, _ in unit.params)
        self.tag_keys.update(key for key, _ in unit.tags)

    def fits(self, unit: Unit) -> bool:
        """Whether `unit` can join this `log_batch` within MLflow's limits."""
        if not (self.units[-1].is_batch and unit.is_batch):
            return False
        params = {key for key, _ in unit.params}
        tags = {key for key, _ in unit.tags}
        if params & self.param_keys or tags & self.tag_keys:
            return False  # one key twice in one log_batch is rejected; send the later value next
        num_metrics = self.num_metrics + len(unit.metrics)
        num_params = len(self.param_keys) + len(params)
        num_tags = len(self.tag_keys) + len(tags)
        return (
            num_metrics <= MAX_METRICS_PER_BATCH
            and num_params <= MAX_PARAMS_TAGS_PER_BATCH
            and num_tags <= MAX_PARAMS_TAGS_PER_BATCH
            and num_metrics + num_params + num_tags <= MAX_ENTITIES_PER_BATCH
        )


def _chunks(items: list, size: int) -> Iterator[tuple]:
    for start in range(0, len(items), size):
        yield tuple(items[start : start + size])


def units_from_line(line_no: int, entry: dict[str, Any], base_dir: str) -> list[Unit]:
    """The units of one replica line (none for `run` and `sync` lines).

    Args:
        line_no: 1-based line number in the replica.
        entry: the parsed JSON object.
        base_dir: directory that artifact paths in the replica are relative to.
    """
    kind = entry["type"]
    if kind == "params":
        items = sorted(entry["params"].items())
        return [Unit(line_no, params=c) for c in _chunks(items, MAX_PARAMS_TAGS_PER_BATCH)]
    if kind == "tags":
        items = sorted(entry["tags"].items())
        return [Unit(line_no, tags=c) for c in _chunks(items, MAX_PARAMS_TAGS_PER_BATCH)]
    if kind == "metrics":
        step, stamp = int(entry["step"]), int(entry["timestamp"])
        points = [(key, float(value), stamp, step) for key, value in entry["values"].items()]
        return [Unit(line_no, metrics=c) for c in _chunks(points, MAX_METRICS_PER_BATCH)]
    if kind == "artifact":
        return [Unit(line_no, artifact_path=os.path.join(base_dir, entry["path"]))]
    if kind == "status":
        return [Unit(line_no, status=entry["status"], end_time=entry.get("end_time"))]
    if kind == "input":
        return [Unit(line_no, dataset=tuple(sorted(entry["dataset"].items())))]
    return []


def pack_sends(units: Iterable[Unit]) -> list[Send]:
    """Pack units, in order, into as few MLflow calls as the batch limits allow."""
    sends: list[Send] = []
    for unit in units:
        if not (sends and sends[-1].fits(unit)):
            sends.append(Send())
        sends[-1].add(unit)
    return sends


def truncate(value: str, limit: int) -> str:
    return value if len(value) <= limit else value[: limit - len(TRUNCATION_MARK)] + TRUNCATION_MARK


def perform(client, run_id: str, send: Send) -> None:
    """Make the one MLflow call of `send` (raises whatever MLflow raises)."""
    from mlflow.entities import Metric, Param, RunTag

    first = send.units[0]
    if first.dataset:
        client.log_inputs(run_id, datasets=[dataset_input(dict(first.dataset))])
        return
    if first.artifact_path is not None:
        client.log_artifact(run_id, first.artifact_path)
        return
    if first.status is not None:
        status = MLFLOW_RUN_STATUS.get(first.status, "FINISHED")
        client.set_terminated(run_id, status=status, end_time=first.end_time)
        return
    units = send.units
    metrics = [Metric(k, v, t, s) for u in units for k, v, t, s in u.metrics]
    params = [Param(k, truncate(v, MAX_PARAM_VALUE_CHARS)) for u in units for k, v in u.params]
    tags = [RunTag(k, truncate(v, MAX_TAG_VALUE_CHARS)) for u in units for k, v in u.tags]
    client.log_batch(run_id, metrics=metrics, params=params, tags=tags, synchronous=True)


def dataset_input(fields: dict[str, str]):
    """An MLflow `DatasetInput` from a replica `input` line's dataset fields."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    dataset = Dataset(**{k: v for k, v in fields.items() if k != "context"})
    return DatasetInput(dataset, tags=[InputTag(MLFLOW_DATASET_CONTEXT, fields["context"])])


def is_transient(exc: BaseException) -> bool | None:
    """True for errors worth retrying (server down, 5xx, 429), False for rejections (4xx).

    None for anything else (a bug), which callers should re-raise.
    """
    import requests
    from mlflow.exceptions import MlflowException

    if isinstance(exc, MlflowException):
        code = exc.get_http_status_code()
        return code >= 500 or code in (408, 429)
    if isinstance(exc, OSError | requests.RequestException):
        return True
    return None


def is_outage(exc: BaseException) -> bool:
    """Whether `exc` says the server is out for now (down, restarting, its database away), not
    that a file or a request was bad: a repeatable call may wait and try again."""
    from k3scale.errors import TrackingOutageError

    if isinstance(exc, TrackingOutageError):
        return True
    # An OSError naming a file is the disk's, not the network's.
    return is_transient(exc) is True and not (isinstance(exc, OSError) and exc.filename)


def credentials_refused(exc: BaseException) -> bool:
    """Whether `exc` is a server refusing the caller (HTTP 401 or 403)."""
    from mlflow.exceptions import MlflowException

    return isinstance(exc, MlflowException) and exc.get_http_status_code() in REFUSED_STATUSES


def refused_message(tracking_uri: str, exc: BaseException) -> str:
    """One line for a refusal: which server, why, and which variables carry the credentials."""
    from mlflow.exceptions import MlflowException

    status = exc.get_http_status_code() if isinstance(exc, MlflowException) else "?"
    user = os.environ.get("MLFLOW_TRACKING_USERNAME")
    who = f"user {user!r}" if user else "a client without credentials"
    return (
        f"MLflow server at {tracking_uri} refused {who} (HTTP {status}): set "
        "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD to a user of that server with "
        "write access to the experiment"
    )


def credentials_env() -> dict[str, str]:
    """The MLflow credentials of this process's environment (what trials elsewhere need too)."""
    return {key: os.environ[key] for key in CREDENTIAL_VARS if os.environ.get(key)}


def tracking_client(tracking_uri: str):
    """An `MlflowClient` for `tracking_uri` with short HTTP timeouts and few retries.

    The settings are process-wide environment variables (MLflow reads them per request); values
    the user already set win.
    """
    for key, value in HTTP_CLIENT_ENV.items():
        os.environ.setdefault(key, value)
    if tracking_uri.startswith("sqlite:///"):
        from k3scale.track.server import ensure_schema

        ensure_schema(tracking_uri.removeprefix("sqlite:///"))
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


# The runs list's columns in the k3scale view: what a researcher reads a trial by (issue 51:
# arch and schedule were only inside the cell string, the seed nowhere).
RUNS_VIEW_COLUMNS = (
    f"metrics.`{schema.FINAL_PREFIX}val_ood_loss`",
    f"metrics.`{schema.FINAL_PREFIX}val_id_loss`",
    f"metrics.`{schema.METRIC_PEAK_LR}`",
    "params.`train.batch_size`",
    f"tags.`{schema.TAG_ARCH}`",
    f"tags.`{schema.TAG_SCHEDULE}`",
    f"tags.`{schema.TAG_SIZE}`",
    f"tags.`{schema.TAG_BUDGET_TOKENS}`",
    "params.`train.seed`",
    f"tags.`{schema.TAG_ARM}`",
    f"tags.`{schema.TAG_CELL}`",
)


def runs_view_tag() -> dict[str, str]:
    """The experiment tag holding the k3scale runs view (columns above, best loss first)."""
    state = {
        "selectedColumns": list(RUNS_VIEW_COLUMNS),
        "orderByKey": RUNS_VIEW_COLUMNS[0],
        "orderByAsc": True,
    }
    # A fixed time: the tag is the same whichever process writes it.
    view = {"name": "k3scale training runs", "createdAt": 0, "updatedAt": 0}
    view["state"] = json.dumps(state)
    return {schema.MLFLOW_SHARED_VIEW_PREFIX + schema.RUNS_VIEW_KEY: json.dumps(view)}


def experiment_id_for(client, name: str) -> str:
    """Id of experiment `name`, created if missing (safe when several processes race), tagged
    as model training and with the k3scale runs view."""
    from mlflow.exceptions import MlflowException

    kind = {schema.MLFLOW_EXPERIMENT_KIND: schema.EXPERIMENT_KIND_TRAINING, **runs_view_tag()}
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return client.create_experiment(name, tags=kind)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            experiment = client.get_experiment_by_name(name)
    if experiment.lifecycle_stage == "deleted":
        raise K3ScaleError(
            f"MLflow experiment {name!r} is deleted: restore it in the MLflow UI or use "
            "another experiment name"
        )
    for key, value in kind.items():
        # Made before these tags (or by another tool).
        if key not in experiment.tags:
            client.set_experiment_tag(experiment.experiment_id, key, value)
    return experiment.experiment_id
