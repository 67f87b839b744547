"""Where run tables come from: an MLflow server (batched reads) or JSONL replicas.

MLflow: runs in run_id order, a page of `BULK_MAX_RUNS` at a time, via `MlflowClient.search_runs`
(each page gets its histories before the next is read); metric histories with the
server's bulk endpoint (`/ajax-api/2.0/mlflow/metrics/get-history-bulk`, up to 100 runs and
25,000 points per request in mlflow 3.17.2, `mlflow/server/handlers.py`), or the SQL store's
`get_metric_history_bulk` for `sqlite://` URIs: one request per (metric, 100 runs), no per-run
round trips. Replicas: `k3scale.track.replica.read_replica` on every `replica.jsonl` under a root.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from k3scale.errors import K3ScaleError
from k3scale.scaling.inputs.tables import RunData
from k3scale.track.replica import find_replicas, read_replica

# mlflow 3.17.2 server/handlers.py: MAX_RUN_IDS_PER_REQUEST and MAX_HISTORY_RESULTS of the bulk
# history endpoint.
BULK_MAX_RUNS = 100
BULK_MAX_POINTS = 25_000
BULK_ENDPOINT = "/ajax-api/2.0/mlflow/metrics/get-history-bulk"


def replica_batches(
    root: Path, experiment: str | None = None, batch_runs: int = BULK_MAX_RUNS
) -> Iterator[list[RunData]]:
    """Every replica under `root` (optionally only those of `experiment`), `batch_runs` at a
    time in run_id order; only one batch's metrics are held at once.

    Raises:
        K3ScaleError: no replica under `root`, or none of `experiment` (at the call).
    """
    paths = find_replicas(root)
    if not paths:
        raise K3ScaleError(f"export: no replica.jsonl under {root}")
    heads = []
    for path in paths:
        head = _replica_head(path)
        if experiment is None or head["experiment"] == experiment:
            heads.append((head["run_id"], path))
    heads.sort()
    if not heads:
        raise K3ScaleError(f"export: no replica under {root} belongs to experiment {experiment!r}")
    return (
        [_replica_run(path) for _, path in heads[start : start + batch_runs]]
        for start in range(0, len(heads), batch_runs)
    )


def _replica_head(path: Path) -> dict:
    """The replica's first line (its run line: run_id, experiment), without reading the rest."""
    with open(path, encoding="utf-8") as handle:
        first = handle.readline()
    try:
        head = json.loads(first)
    except json.JSONDecodeError:
        head = {}
    if head.get("type") != "run":
        raise K3ScaleError(f"{path}: not a k3scale replica (its first line is not a run line)")
    return head


def _replica_run(path: Path) -> RunData:
    record = read_replica(path)
    return RunData(
        run_id=record.run_id,
        experiment=record.experiment,
        run_name=record.run_name,
        source_status=record.status,
        params=dict(record.params),
        tags=dict(record.tags),
        metrics=list(record.metrics),
    )


def server_reachable(tracking_uri: str) -> bool:
    """True for non-HTTP stores (sqlite, file); for HTTP, whether /health answers within 2 s."""
    if not tracking_uri.startswith(("http://", "https://")):
        return True
    from k3scale.track.server import server_answers

    return server_answers(tracking_uri.rstrip("/"))


def mlflow_batches(
    tracking_uri: str, experiment: str, batch_runs: int = BULK_MAX_RUNS
) -> Iterator[list[RunData]]:
    """The runs of `experiment`, `batch_runs` at a time in run_id order, each batch with its
    full metric histories: the server pages the run list in run_id order and each page gets its
    histories as it is read, so memory holds one batch of runs and curves, whatever N.

    Raises:
        K3ScaleError: the experiment is not on the server (at the call, before any batch).
    """
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise K3ScaleError(f"export: experiment {experiment!r} not found at {tracking_uri}")
    return _mlflow_pages(client, tracking_uri, experiment, found.experiment_id, batch_runs)


def _mlflow_pages(client, tracking_uri: str, experiment: str, experiment_id: str, batch_runs: int):
    token = None
    while True:
        page = client.search_runs(
            [experiment_id],
            max_results=batch_runs,
            order_by=["attributes.run_id ASC"],
            page_token=token,
        )
        if page:
            yield _with_histories(client, tracking_uri, experiment, list(page))
        token = page.token
        if not token:
            return


def _with_histories(client, tracking_uri: str, experiment: str, runs) -> list[RunData]:
    histories = _histories(client, tracking_uri, runs)
    return [
        RunData(
            run_id=r.info.run_id,
            experiment=experiment,
            run_name=r.info.run_name,
            source_status=r.info.status,
            params=dict(r.data.params),
            tags=dict(r.data.tags),
            metrics=histories.get(r.info.run_id, []),
        )
        for r in runs
    ]


def _histories(client, tracking_uri: str, runs) -> dict[str, list[tuple[int, str, float]]]:
    """run_id -> [(step, key, value)] for every metric key any run has, in bulk requests."""
    by_key: dict[str, list[str]] = {}
    for run in runs:
        for key in run.data.metrics:
            by_key.setdefault(key, []).append(run.info.run_id)
    fetch = _http_bulk if tracking_uri.startswith(("http://", "https://")) else _store_bulk
    out: dict[str, list[tuple[int, str, float]]] = {}
    for key in sorted(by_key):
        ids = sorted(by_key[key])
        for start in range(0, len(ids), BULK_MAX_RUNS):
            for run_id, step, value in _fetch_all(
                client, fetch, ids[start : start + BULK_MAX_RUNS], key
            ):
                out.setdefault(run_id, []).append((step, key, value))
    for points in out.values():
        points.sort(key=lambda p: (p[1], p[0]))
    return out


def _fetch_all(client, fetch, run_ids: list[str], key: str) -> list[tuple[str, int, float]]:
    """One bulk call; when it hits the point cap, split the runs and ask again."""
    points = fetch(client, run_ids, key)
    if len(points) < BULK_MAX_POINTS:
        return points
    if len(run_ids) == 1:
        return [(run_ids[0], m.step, m.value) for m in client.get_metric_history(run_ids[0], key)]
    half = len(run_ids) // 2
    return _fetch_all(client, fetch, run_ids[:half], key) + _fetch_all(
        client, fetch, run_ids[half:], key
    )


def _http_bulk(client, run_ids: list[str], key: str) -> list[tuple[str, int, float]]:
    from mlflow.utils.rest_utils import MlflowHostCreds, http_request, verify_rest_response

    store = client._tracking_client.store  # the RestStore knows the credentials from the env
    creds = (
        store.get_host_creds()
        if hasattr(store, "get_host_creds")
        else MlflowHostCreds(client.tracking_uri)
    )
    response = http_request(
        creds,
        BULK_ENDPOINT,
        "GET",
        params={"run_id": run_ids, "metric_key": key, "max_results": BULK_MAX_POINTS},
    )
    verify_rest_response(response, BULK_ENDPOINT)
    return [
        (m["run_id"], int(m["step"]), float(m["value"])) for m in response.json().get("metrics", [])
    ]


def _store_bulk(client, run_ids: list[str], key: str) -> list[tuple[str, int, float]]:
    store = client._tracking_client.store
    if hasattr(store, "get_metric_history_bulk"):
        rows = store.get_metric_history_bulk(run_ids, key, BULK_MAX_POINTS)
        return [(r.run_id, int(r.step), float(r.value)) for r in rows]
    return [(rid, m.step, m.value) for rid in run_ids for m in client.get_metric_history(rid, key)]


def collect_runs(experiment: str, tracking_uri: str | None, replicas: Path | None) -> tuple:
    """Runs from MLflow when reachable, else from replicas, all in memory (`run_batches` streams).

    Returns:
        (runs, source description).

    Raises:
        K3ScaleError: neither source is usable.
    """
    batches, source = run_batches(experiment, tracking_uri, replicas)
    runs = [run for batch in batches for run in batch]
    if not runs and not source.startswith("mlflow"):
        raise K3ScaleError(
            f"export: no replica under {replicas} belongs to experiment {experiment!r}"
        )
    return runs, source


def run_batches(
    experiment: str, tracking_uri: str | None, replicas: Path | None
) -> tuple[Iterator[list[RunData]], str]:
    """Batches of runs in run_id order from MLflow when reachable, else from replicas.

    Returns:
        (batches, source description).

    Raises:
        K3ScaleError: neither source is usable.
    """
    if tracking_uri and server_reachable(tracking_uri):
        return mlflow_batches(tracking_uri, experiment), f"mlflow {tracking_uri}"
    if replicas is not None:
        note = f" (MLflow at {tracking_uri} unreachable)" if tracking_uri else ""
        return replica_batches(replicas, experiment), f"replicas {replicas}{note}"
    if tracking_uri:
        raise K3ScaleError(
            f"export: MLflow at {tracking_uri} does not answer; pass --replicas "
            "DIR to export from the JSONL replicas instead"
        )
    raise K3ScaleError("export: give --tracking-uri URI or --replicas DIR")
