"""Experiments open in the MLflow UI as model training (issue 37: they opened as GenAI traces,
"Traces 0 / Latency", because they lacked the tag that says what they are)."""

from __future__ import annotations

import json
import uuid

from mlflow.tracking import MlflowClient

from k3scale.track import schema
from k3scale.track.sending import experiment_id_for


def test_a_new_experiment_is_tagged_as_model_training(mlflow_server):
    client = MlflowClient(mlflow_server)
    made = experiment_id_for(client, f"kind-new-{uuid.uuid4().hex[:8]}")
    tags = client.get_experiment(made).tags
    assert tags[schema.MLFLOW_EXPERIMENT_KIND] == schema.EXPERIMENT_KIND_TRAINING


def test_an_experiment_made_without_the_tag_gains_it(mlflow_server):
    client = MlflowClient(mlflow_server)
    name = f"kind-old-{uuid.uuid4().hex[:8]}"
    old = client.create_experiment(name)
    assert schema.MLFLOW_EXPERIMENT_KIND not in client.get_experiment(old).tags
    assert experiment_id_for(client, name) == old
    tags = client.get_experiment(old).tags
    assert tags[schema.MLFLOW_EXPERIMENT_KIND] == schema.EXPERIMENT_KIND_TRAINING


def test_an_experiment_carries_the_k3scale_runs_view(mlflow_server):
    """The runs list opened with viewStateShareKey=k3scale shows the loss, peak LR, batch, size
    and cell columns (MLflow's defaults show none of them), best loss first."""
    client = MlflowClient(mlflow_server)
    made = experiment_id_for(client, f"view-{uuid.uuid4().hex[:8]}")
    tag = client.get_experiment(made).tags[schema.MLFLOW_SHARED_VIEW_PREFIX + schema.RUNS_VIEW_KEY]
    state = json.loads(json.loads(tag)["state"])
    assert state["selectedColumns"][:4] == [
        "metrics.`final/val_ood_loss`",
        "metrics.`final/val_id_loss`",
        "metrics.`peak_lr`",
        "params.`train.batch_size`",
    ]
    assert {
        "tags.`k3scale.arch`",
        "tags.`k3scale.schedule`",
        "tags.`k3scale.size`",
        "tags.`k3scale.budget_tokens`",
        "params.`train.seed`",
        "tags.`k3scale.cell`",
    } <= set(state["selectedColumns"])
    assert state["orderByKey"] == "metrics.`final/val_ood_loss`" and state["orderByAsc"]
