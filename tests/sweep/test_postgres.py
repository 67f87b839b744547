"""The cluster's Optuna storage on a real PostgreSQL (issue 22): the README's
`--storage postgresql://USER:PASSWORD@HOST:PORT/DB` form works as written (psycopg 3 is a
dependency), the driver's ledgers keep working across a server restart, and the password is
never written to study.json.

The server is a throwaway cluster (`k3scale.bench.local_postgres`) on 127.0.0.1; scripts/setup.sh
installs Debian's PostgreSQL when it is missing.
"""

from __future__ import annotations

import threading
import time

import optuna
import pytest
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from k3scale.bench.local_postgres import LocalPostgres
from k3scale.sweep import run, sources
from k3scale.sweep.declaration import load_study
from k3scale.sweep.identity import check_identity
from k3scale.sweep.ledger import StudyLedger, retrying
from k3scale.sweep.planner import plan_cells
from k3scale.sweep.tracking import TrackingService
from k3scale.track import sending
from k3scale.track.server import start_local_server

PRESET = load_study("experiments/k2_vs_k3.py").preset("cpu_v2")
GRID = PRESET.lr_grid
CELL = plan_cells(load_study("experiments/k2_vs_k3.py"), PRESET)[-1]


@pytest.fixture(scope="module")
def postgres():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with LocalPostgres(databases=("optuna", "mlflow")) as server:
        yield server


def test_the_readme_storage_url_runs_a_grid_cell_through_the_driver_s_ledger(postgres):
    storage = postgres.url("optuna")
    assert storage.startswith("postgresql://k3scale:")  # the README's form, no +driver suffix
    identity = {"git_sha": "a" * 40, "git_dirty": "false", "data_fingerprint": "f" * 64}
    assert check_identity(storage, identity, False, [CELL.key]) == identity
    ledger = StudyLedger(sources.open_cell_study(storage, CELL, seed=0))
    sources.enqueue_grid(ledger, GRID)
    told = []
    while sources.count(ledger, TrialState.WAITING):
        trial = ledger.ask(sources.tuning_distributions(PRESET))
        ledger.tell(trial, 4.0 - trial.params["lr"])
        told.append(trial.params["lr"])
    assert len(told) == GRID.points
    assert sources.best_params(ledger)["lr"] == max(told)
    # Best at the top end: the grid extends upward, and a fresh reader agrees with the ledger.
    (extension,) = sources.grid_extensions(ledger, [ledger], GRID)
    assert extension > max(told)
    fresh = optuna.load_study(study_name=CELL.key, storage=storage)
    assert len(fresh.trials) == len(ledger.get_trials()) == GRID.points


def test_the_ledger_writes_again_after_postgres_restarts(postgres):
    storage = postgres.url("optuna")
    ledger = StudyLedger(sources.open_cell_study(storage, CELL, seed=0))
    before = len(ledger.get_trials())
    postgres.pause()
    postgres.resume()
    sources.enqueue_lr(ledger, 2.5e-2, GRID)
    trial = ledger.ask(sources.tuning_distributions(PRESET))
    ledger.tell(trial, 3.9)
    assert len(ledger.get_trials()) == before + 1
    assert ledger.get_trials()[-1].state == TrialState.COMPLETE


def test_the_ledger_waits_out_postgres_being_down(postgres):
    storage = postgres.url("optuna")
    waits: list[str] = []
    ledger = StudyLedger(sources.open_cell_study(storage, CELL, seed=0), log=waits.append)
    trial = ledger.ask(sources.tuning_distributions(PRESET))
    before = len(ledger.get_trials())
    postgres.pause()
    # The tell is issued while the server is down; it lands once the server is back.
    restart = threading.Timer(3.0, postgres.resume)
    restart.start()
    try:
        started = time.monotonic()
        ledger.tell(trial, 3.8)
        took = time.monotonic() - started
    finally:
        restart.join()
    assert waits and all("study storage unreachable" in w for w in waits), waits
    assert took >= 2.0, took
    fresh = optuna.load_study(study_name=CELL.key, storage=storage)
    assert len(fresh.trials) == before
    assert fresh.trials[trial.number].state == TrialState.COMPLETE
    assert fresh.trials[trial.number].value == 3.8


def test_a_rejected_statement_is_not_retried(postgres):
    ledger = StudyLedger(sources.open_cell_study(postgres.url("optuna"), CELL, seed=0))
    trial = ledger.ask(sources.tuning_distributions(PRESET))
    ledger.tell(trial, 3.7)
    # Optuna refuses a second tell at once (a ValueError): no storage outage, nothing to wait for.
    waits: list[str] = []
    with pytest.raises(ValueError):
        retrying(lambda: ledger.study.tell(trial, 3.6), log=waits.append)
    assert waits == []


def test_study_json_gets_the_storage_url_without_its_password(postgres):
    storage = postgres.url("optuna")
    shown = sources.without_password(storage)
    assert postgres.password not in shown and shown.endswith(f"@127.0.0.1:{postgres.port}/optuna")
    assert sources.without_password("sqlite:////tmp/a/optuna.db") == "sqlite:////tmp/a/optuna.db"


def test_a_study_s_wrap_up_waits_out_postgres_restarting_behind_mlflow(
    postgres, tmp_path, monkeypatch
):
    # Issue 22's rehearsal: every trial of a study had ended when its driver, whose MLflow client
    # a replica replay had left at one retry, closed orphans and exported while PostgreSQL
    # restarted behind a team's MLflow server (whose /health still answered): the job failed.
    for key, value in sending.HTTP_CLIENT_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(run, "WRAP_UP_PAUSE_S", 1.0)
    # Its first start creates MLflow's schema on PostgreSQL: up to a minute on a busy machine.
    backend = postgres.url("mlflow", "postgresql+psycopg")
    server = start_local_server(backend, tmp_path / "art", timeout_s=240)
    try:
        client = MlflowClient(server.url)
        orphan = client.create_run(client.create_experiment("wrap")).info.run_id
        said: list[str] = []
        tracking = TrackingService(tmp_path, server.url, log=said.append)
        tracking.start()
        postgres.pause()
        restart = threading.Timer(4.0, postgres.resume)
        restart.start()
        try:
            assert run._wrap_up(tracking, "wrap", tmp_path, said.append) == server.url
        finally:
            restart.join()
        assert client.get_run(orphan).info.status == "FAILED"
    finally:
        server.stop()
    assert any("MLflow stopped answering while the study was wrapped up" in s for s in said), said
    assert any("exported 1 runs from mlflow" in s for s in said), said
    assert (tmp_path / run.TABLES / "runs.parquet").exists()
