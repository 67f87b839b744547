"""Synthetic study runs with the schema's tags/params/metrics, and writers to real backends."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from k3scale.scaling.inputs.tables import RunData
from k3scale.track import schema
from k3scale.track.replica import ReplicaWriter

SIZES = {"t0": 1_000_000, "t1": 2_000_000, "t2": 4_000_000, "t3": 8_000_000}
# The K3-style arm reaches the K2-style loss with 2.5x less compute (the claim under test).
ARCH_MULTIPLIER = {"k2": 1.0, "k3": 2.5}


def synthetic_runs(
    experiment: str,
    archs=("k2", "k3"),
    schedules=("cosine",),
    sizes=("t0", "t1", "t2", "t3"),
    budgets=(40_000_000, 80_000_000),
    lrs=(1e-3, 3e-3, 1e-2, 3e-2),
    seed: int = 0,
) -> list[RunData]:
    """One run per (arch, schedule, size, budget, lr); loss = frontier(k C) + LR penalty + noise."""
    rng = np.random.default_rng(seed)
    runs = []
    cells = itertools.product(archs, schedules, sizes, budgets)
    for index, (arch, schedule, size, budget) in enumerate(cells):
        n = SIZES[size]
        for j, lr in enumerate(lrs):
            c = 6.0 * n * budget
            base = 2.0 + 400.0 * (ARCH_MULTIPLIER[arch] * c) ** -0.15
            wsd_penalty = 0.01 if schedule == "wsd" else 0.0
            loss = base + wsd_penalty + 0.02 * np.log(lr / 5e-3) ** 2 + rng.normal(0, 0.002)
            run_id = f"{experiment}-{index:03d}-{j}"
            cell = f"{arch}/{schedule}/{size}/{budget}"
            tags = {
                schema.TAG_STUDY: experiment,
                schema.TAG_CELL: cell,
                schema.TAG_ARCH: arch,
                schema.TAG_SCHEDULE: schedule,
                schema.TAG_SIZE: size,
                schema.TAG_BUDGET_TOKENS: str(budget),
                schema.TAG_TRIAL: str(j),
                schema.TAG_ARM: "tuned",
                schema.TAG_STATUS: schema.STATUS_FINISHED,
                schema.TAG_CONFIG_HASH: f"hash{index}{j}",
            }
            params = {
                "optim.lr": str(lr),
                "schedule.lr_min": "3e-05",
                "train.batch_size": "16",
                "data.seq_len": "256",
                "train.seed": "0",
                "train.budget_tokens": str(budget),
                schema.PARAM_N_ACTIVE: str(n),
                schema.PARAM_N_TOTAL: str(2 * n),
                schema.PARAM_FLOPS_PER_TOKEN_6N: str(6 * n),
                schema.PARAM_FLOPS_PER_TOKEN_ATTN: str(6 * n + 3 * 256 * 64),
                schema.PARAM_BATCH_TOKENS: str(16 * 256),
            }
            steps = budget // (16 * 256)
            metrics = []
            for step in (steps // 2, steps):
                metrics += [
                    (step, schema.METRIC_TRAIN_LOSS, loss + 0.1 * (step < steps)),
                    (step, schema.METRIC_VAL_OOD_LOSS, loss + 0.05 * (step < steps)),
                    (step, schema.METRIC_TOKENS, float(step * 16 * 256)),
                ]
            metrics += [
                (steps, schema.FINAL_PREFIX + "val_ood_loss", loss),
                (steps, schema.FINAL_PREFIX + "val_id_loss", loss - 0.1),
                (steps, schema.FINAL_PREFIX + "train_loss", loss - 0.05),
                (steps, schema.FINAL_PREFIX + "tokens", float(steps * 16 * 256)),
            ]
            runs.append(
                RunData(
                    run_id=run_id,
                    experiment=experiment,
                    run_name=f"{cell}#{j}",
                    source_status=schema.STATUS_FINISHED,
                    params=params,
                    tags=tags,
                    metrics=metrics,
                )
            )
    return runs


def write_replicas(runs: list[RunData], root: Path) -> None:
    """One replica.jsonl per run, through the tracking helper's writer."""
    for run in runs:
        writer = ReplicaWriter(Path(root) / run.run_id / schema.REPLICA_FILE)
        writer.write(
            {
                "type": "run",
                "run_id": run.run_id,
                "experiment": run.experiment,
                "run_name": run.run_name,
                "start_time": 0,
            }
        )
        writer.write({"type": "params", "params": run.params})
        writer.write({"type": "tags", "tags": run.tags})
        for step, key, value in run.metrics:
            writer.write({"type": "metrics", "step": step, "timestamp": 0, "values": {key: value}})
        writer.write({"type": "status", "status": run.source_status, "end_time": 1})
        writer.close()


def log_to_mlflow(runs: list[RunData], tracking_uri: str, experiment: str) -> dict[str, str]:
    """Log the runs through MlflowClient (one log_batch per run); returns synthetic -> MLflow id."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    experiment_id = client.create_experiment(experiment)
    ids = {}
    for run in runs:
        created = client.create_run(experiment_id, run_name=run.run_name)
        client.log_batch(
            created.info.run_id,
            metrics=[Metric(k, v, 1000 + i, s) for i, (s, k, v) in enumerate(run.metrics)],
            params=[Param(k, v) for k, v in run.params.items()],
            tags=[RunTag(k, v) for k, v in run.tags.items()],
        )
        client.set_terminated(created.info.run_id, "FINISHED")
        ids[run.run_id] = created.info.run_id
    return ids
