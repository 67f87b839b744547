"""RunTracker against a real local MLflow server: what lands in MLflow and in the replica."""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from k3scale.errors import K3ScaleError, TrackingUnreachableError
from k3scale.track.replica import read_replica, upload_replica
from k3scale.track.schema import TAG_REPLICA_RUN_ID, TAG_STATUS
from k3scale.track.server import free_port, start_local_server
from k3scale.track.tracker import RunTracker

LOG_BATCH_REQUEST = re.compile(r'"POST /api/2\.0/mlflow/runs/log-batch HTTP')


def _experiment() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


def _log_steps(tracker, steps):
    for step in steps:
        tracker.log_metrics(step, {"train/loss": 10.0 / (step + 1), "lr": 1e-3 * step})


def _history(client, run_id, key):
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def _count_log_batch_calls(log_path, previous=-1, wait_s=3.0):
    """log-batch requests in the server's access log; waits briefly for a change."""
    deadline = time.monotonic() + wait_s
    while True:
        count = len(LOG_BATCH_REQUEST.findall(log_path.read_text(errors="replace")))
        if count != previous or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


def test_run_lands_in_mlflow_with_params_tags_metrics_artifact(mlflow_server, tmp_path):
    params = {"optim": {"lr": 3e-3, "betas": (0.9, 0.95)}, "model": {"d_model": 64}}
    params["wide"] = {f"k{i:03d}": i for i in range(230)}  # more params than one batch holds
    params["long"] = "x" * 7000  # longer than MLflow's 6000-character param limit
    tracker = RunTracker(
        mlflow_server, _experiment(), "demo", {"k3scale.arch": "k3"}, params, tmp_path
    )
    _log_steps(tracker, range(12))
    tracker.log_artifact_json("config.json", {"optim": {"lr": 3e-3}})
    tracker.flush()
    tracker.set_tags({"k3scale.size": "t0"})
    tracker.finish("diverged")

    client = MlflowClient(mlflow_server)
    run = client.get_run(tracker.run_id)
    assert run.info.run_name == "demo"
    assert run.info.status == "FINISHED"  # a diverged run ran to its end
    assert run.data.params["optim.lr"] == "0.003"
    assert run.data.params["optim.betas"] == "(0.9, 0.95)"
    assert run.data.params["wide.k229"] == "229"
    assert len(run.data.params) == 234
    assert run.data.params["long"].endswith("[truncated]")
    tags = run.data.tags
    assert tags["k3scale.arch"] == "k3" and tags["k3scale.size"] == "t0"
    assert tags[TAG_STATUS] == "diverged" and tags[TAG_REPLICA_RUN_ID] == tracker.run_id
    assert _history(client, tracker.run_id, "train/loss") == [
        (s, 10.0 / (s + 1)) for s in range(12)
    ]
    assert [a.path for a in client.list_artifacts(tracker.run_id)] == ["config.json"]
    local = client.download_artifacts(tracker.run_id, "config.json", str(tmp_path / "dl"))
    assert json.loads(Path(local).read_text()) == {"optim": {"lr": 3e-3}}

    record = read_replica(tmp_path)
    assert record.run_id == tracker.run_id and record.status == "diverged"
    assert record.params["long"] == "x" * 7000, "the replica keeps the full value"
    assert len(record.metrics) == 24
    assert record.unsent_lines == [] and record.sent_through_line > 0


def test_failed_run_is_failed_in_mlflow(mlflow_server, tmp_path):
    experiment = _experiment()
    with (
        pytest.raises(RuntimeError),
        RunTracker(mlflow_server, experiment, None, {}, {}, tmp_path) as tracker,
    ):
        _log_steps(tracker, range(2))
        raise RuntimeError("training crashed")
    run = MlflowClient(mlflow_server).get_run(tracker.run_id)
    assert run.info.status == "FAILED" and run.data.tags[TAG_STATUS] == "failed"


def test_one_flush_is_one_log_batch_request(mlflow_server, mlflow_local_server, tmp_path):
    tracker = RunTracker(mlflow_server, _experiment(), None, {}, {"a": 1}, tmp_path)
    log_path = mlflow_local_server.log_path
    before = _count_log_batch_calls(log_path, wait_s=0)
    _log_steps(tracker, range(40))  # 80 values over 40 steps
    assert _count_log_batch_calls(log_path, before, wait_s=0.5) == before, "buffered until flush"
    tracker.flush()
    assert _count_log_batch_calls(log_path, before) == before + 1
    tracker.finish("finished")
    client = MlflowClient(mlflow_server)
    assert len(client.get_metric_history(tracker.run_id, "lr")) == 40


def test_unreachable_server_at_start_is_a_clear_error(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    # Its own type (a K3ScaleError) lets a study driver relaunch the run: nothing was written.
    with pytest.raises(TrackingUnreachableError, match=r"unreachable: start it with `k3scale ui`"):
        RunTracker(url, "e", None, {}, {}, tmp_path)
    assert issubclass(TrackingUnreachableError, K3ScaleError)
    assert not (tmp_path / "replica.jsonl").exists()


def test_replica_only_run_needs_no_server(tmp_path):
    tracker = RunTracker(None, "e", "local", {"k3scale.arch": "k2"}, {"a": {"b": 2}}, tmp_path)
    _log_steps(tracker, range(3))
    tracker.finish("finished")
    record = read_replica(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{32}", record.run_id)
    assert record.params == {"a.b": "2"}
    assert record.tags[TAG_STATUS] == "finished" and record.status == "finished"
    assert len(record.metrics) == 6 and record.sent_through_line is None


def test_resumed_run_continues_the_same_mlflow_run(mlflow_server, tmp_path):
    experiment = _experiment()
    first = RunTracker(mlflow_server, experiment, "r", {}, {"a": 1}, tmp_path)
    _log_steps(first, range(3))
    first.close()  # stopped on purpose; the run stays open
    second = RunTracker(mlflow_server, experiment, "r", {}, {"a": 1}, tmp_path, run_id=first.run_id)
    _log_steps(second, range(3, 6))
    second.finish("finished")

    client = MlflowClient(mlflow_server)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert [r.info.run_id for r in runs] == [first.run_id]
    assert [s for s, _ in _history(client, first.run_id, "lr")] == list(range(6))
    assert runs[0].info.status == "FINISHED"
    assert [step for step, key, _ in read_replica(tmp_path).metrics if key == "lr"] == list(
        range(6)
    )


def test_resumed_run_replaying_logged_steps_logs_no_duplicate_rows(mlflow_server, tmp_path):
    """A retried trial resumes from a checkpoint older than its last logged step (issue 23)."""
    experiment = _experiment()
    first = RunTracker(mlflow_server, experiment, "r", {}, {"a": 1}, tmp_path)
    _log_steps(first, range(5))
    first.close()  # as if killed at step 4 with its last checkpoint at step 2
    second = RunTracker(mlflow_server, experiment, "r", {}, {"a": 1}, tmp_path, run_id=first.run_id)
    _log_steps(second, range(2, 8))
    second.log_metrics(7, {"final/val_ood_loss": 3.0})  # a new key at a logged step still lands
    second.finish("finished")

    client = MlflowClient(mlflow_server)
    assert [s for s, _ in _history(client, first.run_id, "lr")] == list(range(8))
    assert [s for s, _ in _history(client, first.run_id, "final/val_ood_loss")] == [7]
    assert [step for step, key, _ in read_replica(tmp_path).metrics if key == "lr"] == list(
        range(8)
    )


def test_resume_refuses_another_runs_replica(tmp_path):
    RunTracker(None, "e", None, {}, {}, tmp_path).close()
    with pytest.raises(K3ScaleError, match="cannot resume run abc"):
        RunTracker(None, "e", None, {}, {}, tmp_path, run_id="abc")
    with pytest.raises(K3ScaleError, match="already exists"):
        RunTracker(None, "e", None, {}, {}, tmp_path)


def test_server_dying_mid_run_loses_nothing(mlflow_server, tmp_path):
    """Training keeps going when the server dies; the replica restores the rest elsewhere."""
    dying = start_local_server(tmp_path / "dying.db", tmp_path / "dying-artifacts", timeout_s=120)
    try:
        experiment = _experiment()
        tracker = RunTracker(
            dying.url, experiment, "r", {"k3scale.arch": "k2"}, {"a": 1}, tmp_path / "run"
        )
        _log_steps(tracker, range(5))
        tracker.set_tags({"k3scale.size": "t0"})
        tracker.flush()
        dying.stop()
        tracker.set_tags({"k3scale.size": "t1"})  # the later value must win everywhere
        for step in range(5, 10):
            _log_steps(tracker, [step])
            tracker.flush()  # must not raise: the server is gone
        tracker.log_artifact_json("config.json", {"a": 1})
        tracker.finish("finished")
    finally:
        dying.stop()

    record = read_replica(tmp_path / "run")
    assert [step for step, key, _ in record.metrics if key == "lr"] == list(range(10))
    assert record.unsent_lines, "the sync line names what never reached MLflow"
    assert record.sent_through_line < record.unsent_lines[0]

    run_id = upload_replica(tmp_path / "run", mlflow_server)
    client = MlflowClient(mlflow_server)
    assert _history(client, run_id, "lr") == [(s, 1e-3 * s) for s in range(10)]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags[TAG_STATUS] == "finished"
    assert run.data.tags[TAG_REPLICA_RUN_ID] == record.run_id
    assert run.data.params == {"a": "1"}
    assert [a.path for a in client.list_artifacts(run_id)] == ["config.json"]

    assert run.data.tags["k3scale.size"] == "t1"

    assert upload_replica(tmp_path / "run", mlflow_server) == run_id, "idempotent"
    assert len(client.get_metric_history(run_id, "lr")) == 10
    assert client.get_run(run_id).data.tags["k3scale.size"] == "t1"


def test_resume_with_a_server_the_run_never_reached_replays_its_replica(mlflow_server, tmp_path):
    experiment = _experiment()
    first = RunTracker(None, experiment, "r", {"k3scale.arch": "k2"}, {"a": 1}, tmp_path)
    _log_steps(first, range(4))
    first.close()
    second = RunTracker(
        mlflow_server,
        experiment,
        "r",
        {"k3scale.arch": "k2"},
        {"a": 1},
        tmp_path,
        run_id=first.run_id,
    )
    _log_steps(second, range(4, 6))
    second.finish("finished")

    assert second.run_id == first.run_id, "the replica's run id stays the run's identity"
    client = MlflowClient(mlflow_server)
    run = client.get_run(second.mlflow_run_id)
    assert run.data.tags[TAG_REPLICA_RUN_ID] == first.run_id
    assert [s for s, _ in _history(client, second.mlflow_run_id, "lr")] == list(range(6))
    assert run.info.status == "FINISHED" and run.data.params == {"a": "1"}
