"""`k3scale bench bookkeeping`: what a study's bookkeeping costs as it grows (issue 22).

For each backend (SQLite, and PostgreSQL when it is installed: a throwaway server from
`k3scale.bench.local_postgres`) and each N, on a real MLflow server and a real Optuna storage:

- `log_ms_per_run`: N synthetic runs logged with the trainer's own `RunTracker`, shaped like a
  k2_vs_k3 cpu_v2 trial (its flattened config and derived params, its tags, 100 steps of the 6
  per-step metrics = 600 points, the final metrics); mean over the N runs and over the last
  tenth (`log_ms_per_run_last`, the marginal cost at that size);
- `export_s` and `export_peak_mb`: `k3scale export` of those N runs in a fresh process (its
  peak resident memory, `ru_maxrss`);
- `optuna_ms_per_trial`: N trials driven as the study driver drives them (12 cells through
  `StudyLedger`s: the least-served cell, ask, tell, the grid-extension check), mean over all and
  over the last tenth.

Each N logs into a new experiment of the same server, so later sizes see a larger database, as
a long study does. `quick` runs N = 20 and 100 on SQLite only.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from k3scale.bench.local_postgres import LocalPostgres, postgres_bin
from k3scale.track import schema
from k3scale.track.sending import HTTP_CLIENT_ENV

SIZES = (100, 1_000, 5_000)
QUICK_SIZES = (20, 100)
STEPS = 100
CELLS = 12
STUDY = Path(__file__).resolve().parents[2] / "experiments" / "k2_vs_k3.py"
PRESET = "cpu_v2"
PER_STEP = (
    schema.METRIC_TRAIN_LOSS,
    schema.METRIC_LR,
    schema.METRIC_TOKENS,
    schema.METRIC_FLOPS,
    schema.METRIC_TOKENS_PER_S,
    schema.METRIC_MFU,
)


def run(quick: bool) -> dict:
    """Returns `{"sizes", "points_per_run", "backends": {name: {str(N): {...}}}, "load_avg_1min"}`."""
    sizes = QUICK_SIZES if quick else SIZES
    backends = ["sqlite"] + ([] if quick or postgres_bin() is None else ["postgresql"])
    load_before = os.getloadavg()[0]
    result = {
        "sizes": list(sizes),
        "points_per_run": STEPS * len(PER_STEP),
        "backends": {name: _backend(name, sizes) for name in backends},
    }
    result["load_avg_1min"] = [load_before, os.getloadavg()[0]]
    return result


def _backend(name: str, sizes: tuple[int, ...]) -> dict:
    from k3scale.track.server import start_local_server

    with tempfile.TemporaryDirectory(prefix="bench-bookkeeping-") as tmp:
        root = Path(tmp)
        postgres = LocalPostgres() if name == "postgresql" else None
        try:
            if postgres is not None:
                postgres.start()
            mlflow_db = postgres.url("mlflow") if postgres else root / "mlflow.db"
            optuna_url = postgres.url("optuna") if postgres else f"sqlite:///{root / 'optuna.db'}"
            server = start_local_server(
                mlflow_db, root / "artifacts", log_path=root / "mlflow.log", timeout_s=300
            )
            try:
                return {str(n): _one_size(n, server.url, optuna_url, root) for n in sizes}
            finally:
                server.stop()
        finally:
            if postgres is not None:
                postgres.stop()


def _one_size(n: int, tracking_uri: str, optuna_url: str, root: Path) -> dict:
    experiment = f"bookkeeping-{n}-{uuid.uuid4().hex[:6]}"
    log_s = _log_runs(n, tracking_uri, experiment, root / experiment)
    export_s, peak_mb = _export(tracking_uri, experiment, root / f"{experiment}-tables")
    optuna_s = _drive_trials(n, optuna_url, experiment)
    tail = max(1, n // 10)
    return {
        "log_ms_per_run": 1e3 * sum(log_s) / n,
        "log_ms_per_run_last": 1e3 * sum(log_s[-tail:]) / tail,
        "export_s": export_s,
        "export_ms_per_run": 1e3 * export_s / n,
        "export_peak_mb": peak_mb,
        "optuna_ms_per_trial": 1e3 * sum(optuna_s) / n,
        "optuna_ms_per_trial_last": 1e3 * sum(optuna_s[-tail:]) / tail,
    }


def _run_shape() -> tuple[dict, dict]:
    """(params, tags) of a real cpu_v2 trial: its flattened config and derived params."""
    from k3scale.config import flatten
    from k3scale.models import accounting
    from k3scale.sweep.declaration import load_study
    from k3scale.sweep.planner import plan_cells, trial_config

    study = load_study(STUDY)
    preset = study.preset(PRESET)
    cell = plan_cells(study, preset)[-1]
    cfg = trial_config(
        study, preset, cell, lr=1e-2, batch_size=7, seed=0, out_dir="runs/x/t000",
        data_root="data_cache", dataset=preset.dataset, tracking_uri=None,
        tags={schema.TAG_TRIAL: f"{cell.key}#t000", schema.TAG_ARM: "tuned"},
    )  # fmt: skip
    params = {k: v for k, v in flatten(cfg).items() if k != "track.tracking_uri"}
    params[schema.PARAM_N_ACTIVE] = accounting.num_params_active(cfg.model)
    params[schema.PARAM_FLOPS_PER_TOKEN_6N] = accounting.flops_per_token_6n(cfg.model)
    tags = {**dict(cfg.track.tags), schema.TAG_CONFIG_HASH: "0" * 16, schema.TAG_ARCH: "k3"}
    return params, tags


def _log_runs(n: int, tracking_uri: str, experiment: str, folder: Path) -> list[float]:
    """Seconds per run, logging each like a trial does (batched flushes, then finish)."""
    from k3scale.track.tracker import RunTracker

    params, tags = _run_shape()
    seconds = []
    for index in range(n):
        started = time.perf_counter()
        tracker = RunTracker(
            tracking_uri, experiment, f"run-{index}", tags, params, folder / f"r{index:05d}"
        )
        for step in range(1, STEPS + 1):
            loss = 4.0 + 2.0 / math.sqrt(step) + 1e-3 * index
            tracker.log_metrics(step, {key: loss for key in PER_STEP})
            if step % 25 == 0:
                tracker.flush()
        tracker.log_metrics(STEPS, {schema.FINAL_PREFIX + "val_ood_loss": 4.2})
        tracker.finish(schema.STATUS_FINISHED)
        seconds.append(time.perf_counter() - started)
    return seconds


EXPORT_IN_CHILD = """
import json, resource, sys
from k3scale.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def _export(tracking_uri: str, experiment: str, out: Path) -> tuple[float, float]:
    """(seconds, peak MB) of `k3scale export` in a fresh process."""
    command = [sys.executable, "-c", EXPORT_IN_CHILD, "export", "--experiment", experiment]
    command += ["--tracking-uri", tracking_uri, "--out", str(out)]
    # A fresh shell's environment: not the trainer's short HTTP timeouts this process has set.
    env = {k: v for k, v in os.environ.items() if k not in HTTP_CLIENT_ENV}
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    seconds = time.perf_counter() - started
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if report["code"] != 0:
        raise RuntimeError(f"export failed: {done.stderr[-400:]}")
    return seconds, report["peak_kb"] / 1024


def _drive_trials(n: int, storage: str, prefix: str) -> list[float]:
    """Seconds per trial of a driver-like loop over `CELLS` cells' ledgers."""
    import optuna
    from optuna.trial import TrialState

    from k3scale.sweep import sources
    from k3scale.sweep.declaration import load_study
    from k3scale.sweep.ledger import StudyLedger
    from k3scale.sweep.planner import Cell

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    preset = load_study(STUDY).preset(PRESET)
    distributions = sources.tuning_distributions(preset)
    # The driver's own cell studies (a grid preset: fixed params, an idle sampler).
    cells = [
        StudyLedger(
            sources.open_cell_study(
                storage,
                Cell(arch="k3", size=f"{prefix}-c{c}", budget_tokens=1, schedule="wsd"),
                seed=0,
                sampled=False,
            )
        )
        for c in range(CELLS)
    ]
    seconds = []
    for index in range(n):
        started = time.perf_counter()
        cell = min(cells, key=lambda s: sources.count(s, TrialState.COMPLETE, TrialState.RUNNING))
        sources.enqueue_lr(cell, preset.lr_grid.center * 1.6 ** (index % 5 - 2), preset.lr_grid)
        trial = cell.ask(distributions)
        cell.tell(trial, 4.0 + (math.log(trial.params["lr"]) + 4.5) ** 2)
        sources.grid_extensions(cell, [cell], preset.lr_grid)
        seconds.append(time.perf_counter() - started)
    return seconds


def render(result: dict) -> str:
    lines = [
        f"bookkeeping per size N ({result['points_per_run']} curve points per run); "
        f"load {result['load_avg_1min'][0]:.1f} -> {result['load_avg_1min'][1]:.1f}",
        f"{'backend':10s} {'N':>6s} {'log ms/run':>11s} {'(last)':>8s} {'export s':>9s} "
        f"{'ms/run':>7s} {'peak MB':>8s} {'optuna ms/trial':>16s} {'(last)':>8s}",
    ]
    for backend, sizes in result["backends"].items():
        for n, r in sizes.items():
            lines.append(
                f"{backend:10s} {n:>6s} {r['log_ms_per_run']:11.1f} "
                f"{r['log_ms_per_run_last']:8.1f} {r['export_s']:9.1f} "
                f"{r['export_ms_per_run']:7.1f} {r['export_peak_mb']:8.0f} "
                f"{r['optuna_ms_per_trial']:16.1f} {r['optuna_ms_per_trial_last']:8.1f}"
            )
    return "\n".join(lines)
