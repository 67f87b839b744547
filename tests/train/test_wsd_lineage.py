"""A WSD trunk and its branches in MLflow as a study's worker logs them (real local server).

Each branch is a run of its own cell (name, cell and budget tags, `track.tags` param) and a child
of its trunk (`mlflow.parentRunId`); every run has the dataset as an MLflow dataset input; final
values are summaries: one point at step 0, which MLflow's UI draws as bars, not line charts.
"""

from __future__ import annotations

import dataclasses
import json
import uuid

from mlflow.tracking import MlflowClient

from k3scale.config import TrackConfig, to_dict
from k3scale.data import open_dataset
from k3scale.sweep.worker import run_payload
from k3scale.track import schema
from k3scale.train.loop import SUMMARY_STEP
from tests.train.conftest import tiny_run, with_schedule

BATCH_TOKENS = 64 * 8
TRUNK_STEPS, BRANCH_STEPS = 16, (8, 12)
FINAL_KEYS = ("train_loss", "val_id_loss", "val_ood_loss", "tokens", "tokens_per_s", "mfu")


def _cell_config(root, study_dir, tracking_uri: str, experiment: str, steps: int):
    """The run a study would give cell tiny|D<budget>|wsd: its own folder, name and tags."""
    budget = steps * BATCH_TOKENS
    key = f"tiny|D{budget}|wsd"
    cfg = tiny_run("k3", root, study_dir / key, budget_tokens=budget)
    cfg = with_schedule(cfg, kind="wsd", decay_fraction=0.25)
    tags = {schema.TAG_CELL: key, schema.TAG_BUDGET_TOKENS: str(budget), schema.TAG_TRIAL: "t000"}
    track = TrackConfig(
        tracking_uri=tracking_uri,
        experiment=experiment,
        run_name=f"{key}|s0",
        tags=tuple(sorted(tags.items())),
    )
    return dataclasses.replace(cfg, track=track)


def test_wsd_branches_are_child_runs_of_their_trunk_with_dataset_and_summaries(
    sample_root, mlflow_server, tmp_path
):
    experiment = f"lineage-{uuid.uuid4().hex[:8]}"
    trunk, *branches = (
        _cell_config(sample_root, tmp_path, mlflow_server, experiment, steps)
        for steps in (TRUNK_STEPS, *BRANCH_STEPS)
    )
    payload = {"config": to_dict(trunk), "branches": [to_dict(b) for b in branches], "threads": 1}
    results = run_payload(payload)["results"]

    client = MlflowClient(mlflow_server)
    runs = {
        run.data.tags[schema.TAG_CELL]: run
        for run in client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    }
    assert len(runs) == 1 + len(branches)
    trunk_run = runs[dict(trunk.track.tags)[schema.TAG_CELL]]
    assert trunk_run.info.run_id == results[str(trunk.train.budget_tokens)]["run_id"]
    assert schema.MLFLOW_PARENT_RUN_ID not in trunk_run.data.tags
    for cfg in branches:
        key, budget = dict(cfg.track.tags)[schema.TAG_CELL], cfg.train.budget_tokens
        run = runs[key]
        assert run.info.run_id == results[str(budget)]["run_id"] != trunk_run.info.run_id
        assert run.info.run_name == cfg.track.run_name
        tags, params = run.data.tags, run.data.params
        assert tags[schema.MLFLOW_PARENT_RUN_ID] == trunk_run.info.run_id
        assert tags[schema.TAG_TRUNK_RUN_ID] == trunk_run.info.run_id
        assert tags[schema.TAG_BUDGET_TOKENS] == params["train.budget_tokens"] == str(budget)
        assert params["track.tags"] == str([list(tag) for tag in cfg.track.tags])
        assert params["track.run_name"] == cfg.track.run_name
        assert params["train.out_dir"] == cfg.train.out_dir
        # The branch's chart shows its trunk's curve up to the fork, then its own decay.
        fork = int(tags[schema.TAG_FORK_STEP])
        trunk_loss = {
            m.step: m.value
            for m in client.get_metric_history(trunk_run.info.run_id, schema.METRIC_TRAIN_LOSS)
        }
        own = client.get_metric_history(run.info.run_id, schema.METRIC_TRAIN_LOSS)
        assert [m.step for m in own] == list(range(1, budget // BATCH_TOKENS + 1))
        assert {m.step: m.value for m in own if m.step <= fork} == {
            step: value for step, value in trunk_loss.items() if step <= fork
        }

    fingerprint = open_dataset("sample", root=sample_root).fingerprint
    for run in runs.values():
        (found,) = run.inputs.dataset_inputs
        assert found.dataset.name == "sample"
        assert found.dataset.digest == fingerprint[:36]
        assert json.loads(found.dataset.source) == {"uri": str(sample_root / "sample")}
        assert {t.key: t.value for t in found.tags} == {schema.MLFLOW_DATASET_CONTEXT: "training"}

        steps = int(run.data.params["train.budget_tokens"]) // BATCH_TOKENS
        # The runs list shows a metric's latest value: the peak LR, not the schedule's floor.
        peak = client.get_metric_history(run.info.run_id, schema.METRIC_PEAK_LR)
        assert [(m.step, m.value) for m in peak] == [
            (SUMMARY_STEP, float(run.data.params["optim.lr"]))
        ]
        for name in FINAL_KEYS:
            history = client.get_metric_history(run.info.run_id, schema.FINAL_PREFIX + name)
            assert [m.step for m in history] == [SUMMARY_STEP], name
        ood = client.get_metric_history(run.info.run_id, schema.METRIC_VAL_OOD_LOSS)
        last = max(ood, key=lambda m: m.step)
        assert last.step == steps
        assert run.data.metrics[schema.FINAL_PREFIX + "val_ood_loss"] == last.value
