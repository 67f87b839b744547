"""Runs another study already trained, reused instead of trained again (`--reuse-runs DIR`).

A finished run of a declared study folder stands in for a trial of this study when it is the
same run: the same config hash (model, data, optimizer, schedule, budget, batch, seed), trained
by the same code commit (clean), on the same kernel path and the same data. It is copied into
this study's MLflow experiment (params, tags, every metric point, its dataset input) as a run
of this trial, tagged `k3scale.reused_from` with the folder and run it came from, and its final
values are told to Optuna as if the trial had trained. Nothing is read from a run that does not
match all four, so a reused result is the result the trial would have logged (to the
nondeterminism of the kernels, which a rerun would not remove either).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from k3scale.errors import K3ScaleError
from k3scale.track import schema


@dataclasses.dataclass(frozen=True)
class ReusableRun:
    """A finished run of a declared study folder, and what a trial's tell needs of it."""

    folder: Path
    tracking_uri: str
    run_id: str
    result: dict

    @property
    def origin(self) -> str:
        return f"{self.folder.name}/{self.run_id}"


def _source_uri(folder: Path) -> tuple[str, str]:
    """(MLflow store URI, experiment name) of a study folder, or a clear error."""
    record = folder / "study.json"
    db = folder / "mlflow" / "mlflow.db"
    if not record.exists() or not db.exists():
        raise K3ScaleError(
            f"--reuse-runs {folder}: not a study folder (it needs study.json and mlflow/mlflow.db)"
        )
    return f"sqlite:///{db}", json.loads(record.read_text())["study"]


def ended_runs(tracking_uri: str, experiment: str) -> list:
    """Every run of `experiment` whose training ended (finished or diverged), MLflow's objects."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    runs, token = [], None
    while True:
        page = client.search_runs([found.experiment_id], max_results=1000, page_token=token)
        ended = (schema.STATUS_FINISHED, schema.STATUS_DIVERGED)
        runs += [r for r in page if r.data.tags.get(schema.TAG_STATUS) in ended]
        token = page.token
        if not token:
            return runs


def run_result(run) -> dict:
    """What a trial's tell records of an ended MLflow run."""
    tags, metrics = run.data.tags, run.data.metrics
    return {
        "status": tags[schema.TAG_STATUS],
        "run_id": run.info.run_id,
        "config_hash": tags.get(schema.TAG_CONFIG_HASH, ""),
        "out_dir": "",
        "tokens": int(metrics.get(schema.FINAL_PREFIX + "tokens", 0)),
        "final_val_ood_loss": metrics.get(schema.FINAL_PREFIX + "val_ood_loss", math.nan),
        "final_val_id_loss": metrics.get(schema.FINAL_PREFIX + "val_id_loss", math.nan),
    }


def reusable_runs(folders, required_tags: dict[str, str]) -> dict[str, ReusableRun]:
    """Config hash -> a run of `folders` this study may reuse: one whose tags hold every
    `required_tags` value (this study's commit, clean tree, kernel path and data)."""
    out: dict[str, ReusableRun] = {}
    for folder in (Path(f).resolve() for f in folders):
        uri, experiment = _source_uri(folder)
        for run in ended_runs(uri, experiment):
            tags = run.data.tags
            if all(tags.get(k) == v for k, v in required_tags.items()):
                key = tags.get(schema.TAG_CONFIG_HASH, "")
                out.setdefault(key, ReusableRun(folder, uri, run.info.run_id, run_result(run)))
    return out


def copy_run(source: ReusableRun, cfg, lineage: dict[str, str] | None = None) -> dict:
    """Copy `source` into the experiment of trial config `cfg` as that trial's run: its params
    and tags with `cfg`'s tracking fields on top (study, cell, trial, arm, run name), `lineage`
    (a branch's trunk and parent) and `k3scale.reused_from`, every metric point and its
    dataset input. Returns its result with the new run's id. (Artifacts such as config.json
    stay with the source run.)"""
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    from k3scale.config import flatten
    from k3scale.track.sending import experiment_id_for

    track = cfg.track
    src, dst = MlflowClient(source.tracking_uri), MlflowClient(track.tracking_uri)
    run = src.get_run(source.run_id)
    # MLflow's own tags (user, source, parent) describe the source run; lineage replaces them.
    tags = {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")}
    tags |= dict(track.tags) | (lineage or {}) | {schema.TAG_REUSED_FROM: source.origin}
    made = dst.create_run(
        experiment_id_for(dst, track.experiment),
        start_time=run.info.start_time,
        tags=tags,
        run_name=track.run_name,
    )
    own = flatten(cfg)
    params = {k: str(own[k]) if k.startswith("track.") else v for k, v in run.data.params.items()}
    points = [
        Metric(key, m.value, m.timestamp, m.step)
        for key in run.data.metrics
        for m in src.get_metric_history(source.run_id, key)
    ]
    new_id = made.info.run_id
    # MLflow's batch limits (mlflow/utils/validation.py): 100 params, 1000 metrics per call.
    items = [Param(k, v) for k, v in params.items()]
    for start in range(0, len(items), 100):
        dst.log_batch(new_id, params=items[start : start + 100])
    for start in range(0, len(points), 1000):
        dst.log_batch(new_id, metrics=points[start : start + 1000])
    if run.inputs and run.inputs.dataset_inputs:
        dst.log_inputs(new_id, datasets=list(run.inputs.dataset_inputs))
    dst.set_terminated(new_id, status=run.info.status, end_time=run.info.end_time)
    return {**source.result, "run_id": new_id}
