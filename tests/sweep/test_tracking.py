"""The study's MLflow service as the driver sees it, against the session's real MLflow server."""

from __future__ import annotations

import uuid

import pytest
from mlflow.tracking import MlflowClient

from k3scale.errors import K3ScaleError
from k3scale.sweep.tracking import TrackingService
from k3scale.track import schema


def test_runs_left_running_are_closed_as_failed_and_ended_runs_are_untouched(
    mlflow_server, tmp_path
):
    experiment = f"orphans-{uuid.uuid4().hex[:8]}"
    client = MlflowClient(mlflow_server)
    experiment_id = client.create_experiment(experiment)
    orphan = client.create_run(experiment_id).info.run_id  # its process died: still RUNNING
    done = client.create_run(experiment_id).info.run_id
    client.set_tag(done, schema.TAG_STATUS, schema.STATUS_FINISHED)
    client.set_terminated(done, status="FINISHED")
    service = TrackingService(tmp_path, mlflow_server, log=lambda _: None)
    service.start()

    assert service.close_orphans(experiment) == 1
    assert client.get_run(orphan).info.status == "FAILED"
    assert client.get_run(orphan).data.tags[schema.TAG_STATUS] == schema.STATUS_FAILED
    assert client.get_run(done).info.status == "FINISHED"
    assert client.get_run(done).data.tags[schema.TAG_STATUS] == schema.STATUS_FINISHED
    assert service.close_orphans(experiment) == 0


@pytest.mark.parametrize("uri", ["ftp://example.invalid/mlflow", "file:///tmp/mlruns", "nonsense"])
def test_a_tracking_uri_that_is_no_server_url_is_refused(tmp_path, uri):
    with pytest.raises(K3ScaleError, match=r"expected the http\(s\) URL"):
        TrackingService(tmp_path, uri)
