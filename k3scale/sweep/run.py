"""`run_study`: set up storage, tracking and Ray around the driver, then record `study.json`.

Local defaults: the study folder holds the Optuna SQLite database, the MLflow SQLite database
behind a lean MLflow server started on 127.0.0.1, the runs' checkpoints and JSONL replicas, and
`study.json`. `ray_address`, `tracking_uri` and `storage` point any of these at a team's services.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from k3scale.errors import K3ScaleError
from k3scale.sweep.declaration import load_study
from k3scale.sweep.driver import Driver, SweepContext, default_slots
from k3scale.sweep.planner import estimate_cost, plan_cells
from k3scale.sweep.tracking import TrackingService

STUDY_JSON = "study.json"
TABLES = "tables"


def default_study_dir(study_name: str, preset: str) -> Path:
    return Path("studies") / f"{study_name}-{preset}"


def run_study(
    study_path: str | Path,
    preset_name: str,
    *,
    study_dir: str | Path | None = None,
    ray_address: str | None = None,
    tracking_uri: str | None = None,
    storage: str | None = None,
    data_root: str = "data_cache",
    dataset: str = "english_mix",
    log=print,
) -> dict[str, Any]:
    """Run (or resume) a study to completion and return what `study.json` records."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = load_study(study_path)
    preset = study.preset(preset_name)
    folder = Path(study_dir or default_study_dir(study.name, preset_name)).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    data_root = str(Path(data_root).resolve())
    fingerprint = _check_data(data_root, dataset)
    storage = storage or f"sqlite:///{folder / 'optuna.db'}"
    started = time.time()
    with ExitStack() as stack:
        tracking = TrackingService(folder, tracking_uri, log)
        tracking_uri = tracking.start()
        stack.callback(tracking.stop)
        _create_experiment(tracking_uri, study.name)
        slots = _start_ray(ray_address, preset, stack)
        ctx = SweepContext(
            study=study,
            preset=preset,
            study_dir=folder,
            storage=storage,
            tracking_uri=tracking_uri,
            data_root=data_root,
            dataset=dataset,
        )
        log(
            f"study {study.name} preset {preset_name}: {len(plan_cells(study, preset))} cells, "
            f"{slots} trials at a time; folder {folder}; MLflow {tracking_uri}"
        )
        driver = Driver(ctx, slots=slots, log=log, tracking=tracking)
        setup_s = time.time() - started
        sweep_started = time.time()
        counters = driver.run()
        sweep_s = time.time() - sweep_started
        if counters.launched:
            tracking_uri = tracking.ensure_up()
            tracking.recover(folder / "runs")
            _export_tables(study.name, tracking_uri, folder, log)
    wall = time.time() - started
    if counters.launched == 0:
        log(f"study {study.name} ({preset_name}) is already complete: nothing to run ({folder})")
        return _read_json(folder / STUDY_JSON) or {}
    cores = slots * preset.threads_per_trial
    # The sweep engine's overhead: trial time over the sweep loop's wall time (setup excluded).
    utilization = counters.busy_s / (sweep_s * cores) if sweep_s > 0 else 0.0
    record = {
        "study": study.name,
        "preset": preset_name,
        "study_file": str(Path(study_path).resolve()),
        "folder": str(folder),
        "storage": storage,
        "tracking_uri": tracking_uri,
        "data_fingerprint": fingerprint,
        "cells": [c.key for c in plan_cells(study, preset)],
        "trials": {
            "finished": counters.finished,
            "failed": counters.failed,
            "diverged": counters.diverged,
        },
        "tokens_trained": counters.tokens,
        "planned": estimate_cost(study, preset),
        "wall_s": round(wall, 1),
        "setup_s": round(setup_s, 1),
        "sweep_s": round(sweep_s, 1),
        "busy_trial_s": round(counters.busy_s, 1),
        "cores": cores,
        "utilization": round(utilization, 4),
    }
    _write_json(folder / STUDY_JSON, record)
    log(
        f"study {study.name} done in {wall / 60:.1f} min: trials finished {counters.finished}, "
        f"failed {counters.failed}, diverged {counters.diverged}; utilization {utilization:.2f} "
        f"(busy trial time / (wall x {cores} cores)); {folder / STUDY_JSON}"
    )
    return record


def _check_data(data_root: str, dataset: str) -> str:
    from k3scale.data import open_dataset

    try:
        return open_dataset(dataset, root=data_root).fingerprint
    except K3ScaleError as exc:
        raise K3ScaleError(f"{exc} (run `k3scale data prepare` first)") from None


def _create_experiment(tracking_uri: str, name: str) -> None:
    """Create the experiment before any worker starts (workers would race to create it)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    if client.get_experiment_by_name(name) is None:
        client.create_experiment(name)


def _start_ray(address: str | None, preset, stack: ExitStack) -> int:
    import ray

    for key, value in {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}.items():
        os.environ.setdefault(key, value)
    if ray.is_initialized():
        return default_slots(preset)
    # Inside a Ray Job (`k3scale study submit`) Ray sets RAY_ADDRESS to the job's cluster.
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False)
        cpus = int(ray.cluster_resources().get("CPU", 1))
        stack.callback(ray.shutdown)
        return max(1, cpus // max(1, preset.threads_per_trial))
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    stack.callback(ray.shutdown)
    return default_slots(preset)


def _export_tables(experiment: str, tracking_uri: str, folder: Path, log) -> None:
    """runs.parquet and curves.parquet of the study in `<folder>/tables` (what fits read)."""
    from k3scale.scaling.sources import collect_runs
    from k3scale.scaling.tables import build_tables, write_tables

    runs, source = collect_runs(experiment, tracking_uri, folder / "runs")
    runs_df, curves_df = build_tables(runs)
    write_tables(runs_df, curves_df, folder / TABLES)
    log(f"exported {runs_df.height} runs from {source} to {folder / TABLES}")


def _read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def _write_json(path: Path, record: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
