"""`run_study`: set up storage, tracking and Ray around the driver, then record `study.json`.

Local defaults: the study folder holds the Optuna SQLite database, the MLflow SQLite database
behind a lean MLflow server started on 127.0.0.1, the runs' checkpoints and JSONL replicas, and
`study.json`. `ray_address`, `tracking_uri` and `storage` point any of these at a team's services.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Any

from k3scale.errors import K3ScaleError
from k3scale.ops.cpu.build import kernel_path, slow_path_notice
from k3scale.sweep import reaper
from k3scale.sweep.declaration import load_study
from k3scale.sweep.driver import Driver, SweepContext, default_slots
from k3scale.sweep.folder import STUDY_JSON, TABLES, UTILIZATION_MEANS, default_study_dir
from k3scale.sweep.identity import (
    DATA_FINGERPRINT,
    GIT_DIRTY,
    GIT_SHA,
    KERNEL_PATH,
    check_identity,
    current_identity,
)
from k3scale.sweep.planner import estimate_cost, plan_cells
from k3scale.sweep.reuse import reusable_runs
from k3scale.sweep.sources import without_password
from k3scale.sweep.tracking import TrackingService, summary_experiment
from k3scale.track import schema

# What study.json says about the driver that last trained (kept by one that had nothing to run).
_TIMINGS = (
    "tokens_trained",
    "wall_s",
    "setup_s",
    "sweep_s",
    "busy_trial_s",
    "cores",
    "utilization",
    "fixed_overhead_s_per_trial",
    "fixed_overhead_s_max",
    "overhead_by_phase_s",
)
# How long a --ray-address may take to accept a TCP connection (seconds).
RAY_CONNECT_TIMEOUT_S = 10.0
# How long the end of a study waits out an MLflow outage, and the pause between its tries (s).
WRAP_UP_OUTAGE_S = 300.0
WRAP_UP_PAUSE_S = 5.0
# The Ray a study starts for itself listens on loopback only and asks every caller for the
# token in this file of the study folder (issue 23).
LOCAL_RAY_HOST = "127.0.0.1"
RAY_TOKEN = "ray_token"


def run_study(
    study_path: str | Path,
    preset_name: str,
    *,
    study_dir: str | Path | None = None,
    ray_address: str | None = None,
    tracking_uri: str | None = None,
    storage: str | None = None,
    data_root: str = "data_cache",
    dataset: str | None = None,
    allow_code_change: bool = False,
    reuse_from: tuple[str, ...] = (),
    log=print,
) -> dict[str, Any]:
    """Run (or resume) a study to completion and return what `study.json` records.

    Every successful return leaves the exported tables and a complete `study.json`, also when
    an earlier driver had already run every trial (and died before exporting).
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = load_study(study_path)
    preset = study.preset(preset_name)
    dataset = dataset or preset.dataset
    folder = Path(study_dir or default_study_dir(study.name, preset_name)).resolve()
    if folder.exists() and not folder.is_dir():
        raise K3ScaleError(f"--study-dir {folder} is a file, not a folder")
    data_root = str(Path(data_root).resolve())
    fingerprint = _check_data(data_root, dataset, model_vocab(preset))
    tracking = TrackingService(folder, tracking_uri, log)
    _check_reachable(ray_address or os.environ.get("RAY_ADDRESS"))
    # Nothing is written before the inputs above are checked.
    folder.mkdir(parents=True, exist_ok=True)
    storage = storage or f"sqlite:///{folder / 'optuna.db'}"
    cell_keys = [c.key for c in plan_cells(study, preset)]
    identity = check_identity(
        storage, current_identity(fingerprint), allow_code_change, cell_keys, log
    )
    if notice := slow_path_notice():
        log(notice)
    reuse = _reusable(reuse_from, identity, log)
    previous = _read_json(folder / STUDY_JSON) or {}
    record = {
        "study": study.name,
        "preset": preset_name,
        "study_file": str(Path(study_path).resolve()),
        "folder": str(folder),
        "storage": without_password(storage),
        "data_fingerprint": fingerprint,
        "identity": identity,
        "kernel_path": asdict(kernel_path()),
        "cells": cell_keys,
        "planned": estimate_cost(study, preset),
    }
    # Written before any trial: a folder always says which code and data it belongs to.
    _write_json(folder / STUDY_JSON, {**previous, **record, "state": "running"})
    started = time.time()
    with ExitStack() as stack:
        # Ray first: a bad address fails before an MLflow server is started.
        slots = _start_ray(ray_address, preset, folder, stack)
        tracking_uri = tracking.start()
        stack.callback(tracking.stop)
        _create_experiment(tracking_uri, study.name, study_note(study, preset_name, identity))
        ctx = SweepContext(
            study=study,
            preset=preset,
            study_dir=folder,
            storage=storage,
            tracking_uri=tracking_uri,
            data_root=data_root,
            dataset=dataset,
            reuse=reuse,
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
        # Also after "nothing to run": a driver killed after its last trial exported nothing.
        tracking_uri = _wrap_up(tracking, study.name, folder, log)
    wall = time.time() - started
    cores = slots * preset.threads_per_trial
    record |= {"tracking_uri": tracking_uri, "trials": driver.trial_totals(), "state": "complete"}
    if counters.reused or "reused_runs" in previous:
        record["reused_runs"] = previous.get("reused_runs", 0) + counters.reused
    if counters.launched == 0:
        if not counters.reused:
            log(
                f"study {study.name} ({preset_name}) is already complete: nothing to run ({folder})"
            )
        # The timings describe the driver that trained; keep them when this one trained nothing.
        record |= dict.fromkeys(_TIMINGS, 0) | {"cores": cores}
        record |= {k: previous[k] for k in _TIMINGS if k in previous}
    else:
        # The sweep engine's overhead: trial time over the sweep loop's wall time (setup excluded).
        utilization = counters.busy_s / (sweep_s * cores) if sweep_s > 0 else 0.0
        record |= {
            "tokens_trained": counters.tokens,
            "wall_s": round(wall, 1),
            "setup_s": round(setup_s, 1),
            "sweep_s": round(sweep_s, 1),
            "busy_trial_s": round(counters.busy_s, 1),
            "cores": cores,
            "utilization": round(utilization, 4),
            **overhead_summary(counters.timings),
        }
    _write_json(folder / STUDY_JSON, record)
    trials = record["trials"]
    log(
        f"study {study.name} done: trials finished {trials['finished']}, failed "
        f"{trials['failed']}, diverged {trials['diverged']}; this driver {wall / 60:.1f} min, "
        f"utilization {record['utilization']:.2f} {UTILIZATION_MEANS} on {record['cores']} "
        f"cores; {folder / STUDY_JSON}"
    )
    return record


def overhead_summary(timings: list[dict[str, float]]) -> dict:
    """Medians over finished tasks: `fixed_overhead_s_per_trial` (slot time minus step time) and
    each phase of it (`overhead_by_phase_s`: imports, run setup, evaluation, MLflow calls during
    and after the steps, checkpoints, and the rest: worker start, transfers, the driver's turn)."""
    if not timings:
        return {}
    named = {
        "imports": "import_s",
        "run_setup": "setup_s",
        "evaluation": "eval_s",
        "tracking": "track_s",
        "checkpoints": "checkpoint_s",
    }
    rest = [t["overhead_s"] - sum(t.get(k, 0.0) for k in named.values()) for t in timings]
    phases = {name: statistics.median(t.get(k, 0.0) for t in timings) for name, k in named.items()}
    phases["other"] = statistics.median(rest)
    overheads = [t["overhead_s"] for t in timings]
    return {
        "fixed_overhead_s_per_trial": round(statistics.median(overheads), 3),
        # A fresh worker's first task pays the process start and imports: the tail shows it.
        "fixed_overhead_s_max": round(max(overheads), 3),
        "overhead_by_phase_s": {k: round(v, 3) for k, v in phases.items()},
    }


def model_vocab(preset) -> int:
    """The smallest vocabulary of the preset's models: every token id must fit it."""
    from k3scale.models.presets import get_preset

    return min(get_preset(size).vocab_size for ladder in preset.sizes.values() for size in ladder)


def _check_data(data_root: str, dataset: str, vocab_size: int) -> str:
    """The dataset's fingerprint, once it is known to be prepared and to fit the models'
    vocabulary (else every trial would fail on it, one by one)."""
    from k3scale.data import open_dataset

    prepare = (
        f"k3scale data prepare --name {Path(dataset).name} --vocab-size {vocab_size} "
        f"--out {data_root}"
    )
    try:
        opened = open_dataset(dataset, root=data_root)
    except K3ScaleError as exc:
        raise K3ScaleError(f"{exc}; the study's models want `{prepare}`") from None
    if opened.vocab_size > vocab_size:
        raise K3ScaleError(
            f"dataset {dataset!r} has a vocabulary of {opened.vocab_size}, larger than the "
            f"study's models' {vocab_size}: rebuild it with `{prepare} --force`"
        )
    return opened.fingerprint


def _reusable(folders, identity: dict[str, str], log) -> dict:
    """The runs of `folders` this study may reuse (k3scale/sweep/reuse.py), said in the log."""
    if not folders:
        return {}
    if identity[GIT_DIRTY] == "true":
        raise K3ScaleError(
            "--reuse-runs needs a clean checkout: a run is reused only when the same commit "
            "trained it, and uncommitted changes make that unknowable"
        )
    required = {
        schema.TAG_GIT_SHA: identity[GIT_SHA],
        schema.TAG_GIT_DIRTY: "false",
        schema.TAG_KERNEL_PATH: identity[KERNEL_PATH],
        schema.TAG_DATA_FINGERPRINT: identity[DATA_FINGERPRINT],
    }
    found = reusable_runs(folders, required)
    log(
        f"--reuse-runs: {len(found)} finished runs of {', '.join(map(str, folders))} share this "
        f"study's commit {identity[GIT_SHA][:12]}, kernel path and data; a trial that would "
        "train one of them copies it instead"
    )
    return found


def _create_experiment(tracking_uri: str, name: str, note: str) -> None:
    """Create the experiment before any worker starts (workers would race to create it), with
    `note` as its description."""
    from mlflow.tracking import MlflowClient

    from k3scale.track.schema import MLFLOW_NOTE
    from k3scale.track.sending import experiment_id_for

    client = MlflowClient(tracking_uri)
    client.set_experiment_tag(experiment_id_for(client, name), MLFLOW_NOTE, note)


def study_note(study, preset_name: str, identity: dict[str, str]) -> str:
    """The experiment's description (Markdown): the study, its preset and its start commit."""
    dirty = " (uncommitted changes)" if identity[GIT_DIRTY] == "true" else ""
    return (
        f"**k3scale study `{study.name}`**, preset `{preset_name}`: {study.description}\n\n"
        f"Code commit `{identity[GIT_SHA]}`{dirty}; data fingerprint "
        f"`{identity[DATA_FINGERPRINT][:16]}`. Fits and dashboard: `k3scale study report "
        f"<study file> --preset {preset_name}` (not `--brief`) logs them to experiment "
        f"`{summary_experiment(study.name)}`, which exists from then on."
    )


def _start_ray(address: str | None, preset, folder: Path, stack: ExitStack) -> int:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return default_slots(preset)
    # Inside a Ray Job (`k3scale study submit`) Ray sets RAY_ADDRESS to the job's cluster.
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        import ray

        try:
            ray.init(address=address, log_to_driver=False)
        except (ConnectionError, RuntimeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise K3ScaleError(f"cannot join the Ray cluster at {address}: {first}") from None
        cpus = int(ray.cluster_resources().get("CPU", 1))
        stack.callback(ray.shutdown)
        return max(1, cpus // max(1, preset.threads_per_trial))
    _set_local_ray_env(folder / RAY_TOKEN)  # before `import ray`: Ray reads it at import
    import ray

    owner = secrets.token_hex(8)
    reaper_process = subprocess.Popen(
        [sys.executable, "-m", "k3scale.sweep.reaper", owner],
        stdin=subprocess.PIPE,
        start_new_session=True,
    )
    stack.callback(_stop_reaper, reaper_process)
    # Only the processes ray.init starts carry the mark (workers inherit it from the raylet).
    os.environ[reaper.MARK] = owner
    try:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    finally:
        del os.environ[reaper.MARK]
    stack.callback(ray.shutdown)
    if ray.util.get_node_ip_address() != LOCAL_RAY_HOST:
        raise K3ScaleError(
            f"the local Ray runs on {ray.util.get_node_ip_address()}, not {LOCAL_RAY_HOST}: "
            "Ray was imported before the study set its environment"
        )
    return default_slots(preset)


def _set_local_ray_env(token_path: Path) -> None:
    """Loopback only and token auth for the Ray this driver starts (what Ray 2.60 honours)."""
    _write_token(token_path)
    # A requested node IP of 127.0.0.1 is rewritten to the machine's address unless Ray runs in
    # its single-node mode (ray/_private/services.py get_node_ip_address); on a 127.0.0.1 node
    # Ray 2.60 binds GCS, raylet, workers and agents to loopback instead of 0.0.0.0.
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    # Overrides the entry points' default (k3scale/cli.py); a Ray this driver owns needs no opt-out.
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(token_path)
    os.environ.pop("RAY_AUTH_TOKEN", None)  # it would take precedence over the file


def _write_token(path: Path) -> None:
    """A fresh random token, created owner-only (0600) so it is never readable by others."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(32))


def _stop_reaper(process: subprocess.Popen) -> None:
    """Closing the pipe lets the reaper kill whatever `ray.shutdown` left, then exit."""
    process.stdin.close()
    process.wait(timeout=60)


def _check_reachable(address: str | None) -> None:
    """A HOST:PORT address must accept a connection within seconds; Ray itself retries for
    minutes before giving up on an address where nothing listens."""
    host, sep, port = (address or "").removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto", "local": Ray resolves them itself
    try:
        socket.create_connection((host, int(port)), timeout=RAY_CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise K3ScaleError(
            f"no Ray cluster answers at {address} ({exc.strerror or type(exc).__name__}); "
            "start one with `ray start --head`, or leave out --ray-address for a local Ray"
        ) from None


def _wrap_up(tracking: TrackingService, experiment: str, folder: Path, log) -> str:
    """Replay the replicas MLflow missed, close runs left running and export the tables; returns
    the server's URL.

    Every step is idempotent, so a server that stops answering part-way (restarted, or its
    database restarting behind it while /health still answers) is waited for and the whole
    sequence run again, for up to WRAP_UP_OUTAGE_S: a study whose trials all ended must not
    fail in its last minute (issue 22: a replay had set this process's MLflow client to one
    retry, and the export then met PostgreSQL restarting).
    """
    from k3scale.sweep.ledger import first_line
    from k3scale.track.sending import is_outage

    deadline = time.monotonic() + WRAP_UP_OUTAGE_S
    while True:
        try:
            tracking_uri = tracking.ensure_up()
            tracking.recover(folder / "runs")
            tracking.close_orphans(experiment)
            _export_tables(experiment, tracking_uri, folder, log)
            return tracking_uri
        except Exception as exc:
            if not is_outage(exc) or time.monotonic() + WRAP_UP_PAUSE_S > deadline:
                raise
            log(
                f"MLflow stopped answering while the study was wrapped up ({type(exc).__name__}: "
                f"{first_line(exc)}); trying again in {WRAP_UP_PAUSE_S:g} s"
            )
            time.sleep(WRAP_UP_PAUSE_S)


def _export_tables(experiment: str, tracking_uri: str, folder: Path, log) -> None:
    """runs.parquet and curves.parquet of the study in `<folder>/tables` (what fits read)."""
    from k3scale.scaling.inputs.sources import run_batches
    from k3scale.scaling.inputs.tables import write_table_batches

    batches, source = run_batches(experiment, tracking_uri, folder / "runs")
    runs, _ = write_table_batches(batches, folder / TABLES)
    log(f"exported {runs} runs from {source} to {folder / TABLES}")


def _read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def _write_json(path: Path, record: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
