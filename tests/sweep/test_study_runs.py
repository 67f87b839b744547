"""Whole studies with real processes: a real Ray, a real MLflow server, real signals.

Each test runs `k3scale study run ... --preset smoke` on the committed sample corpus as a child
process and checks what it left: one finished MLflow run per trial with every tag, an Optuna
study per cell, and no finished run lost or duplicated after a SIGKILL of the driver or of a
trial's worker process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from k3scale.data.sample import prepare_sample
from k3scale.track import schema
from tests.test_cli_habits import k3scale as k3scale_cli

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
K2_VS_K3 = ROOT / "experiments" / "k2_vs_k3.py"
COSINE_VS_WSD = ROOT / "experiments" / "cosine_vs_wsd.py"
K3_ABLATIONS = ROOT / "experiments" / "k3_ablations.py"
REQUIRED_TAGS = (
    schema.TAG_STUDY,
    schema.TAG_CELL,
    schema.TAG_TRIAL,
    schema.TAG_ARCH,
    schema.TAG_SCHEDULE,
    schema.TAG_SIZE,
    schema.TAG_BUDGET_TOKENS,
    schema.TAG_CONFIG_HASH,
    schema.TAG_GIT_SHA,
    schema.TAG_DATA_FINGERPRINT,
    schema.TAG_STATUS,
)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    prepare_sample(root, vocab_size=512)
    return root


def study_command(study: Path, study_dir: Path, data_root: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "k3scale.cli",
        "study",
        "run",
        str(study),
        "--preset",
        "smoke",
        "--study-dir",
        str(study_dir),
        "--data-root",
        str(data_root),
        "--dataset",
        "sample",
    ]


def start(study: Path, study_dir: Path, data_root: Path) -> subprocess.Popen:
    study_dir.mkdir(parents=True, exist_ok=True)
    # The child writes to this handle for its whole life, so no context manager here.
    log = open(study_dir.parent / f"{study_dir.name}.log", "ab")  # noqa: SIM115
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        study_command(study, study_dir, data_root),
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def run_to_end(
    study: Path, study_dir: Path, data_root: Path, *extra: str, timeout: float = 900
) -> str:
    done = subprocess.run(
        [*study_command(study, study_dir, data_root), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def optuna_counts(study_dir: Path) -> Counter:
    """Trial states over every Optuna study of the folder (read-only SQL, safe while running)."""
    db = study_dir / "optuna.db"
    if not db.exists():
        return Counter()
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            rows = conn.execute("SELECT state FROM trials").fetchall()
    except sqlite3.OperationalError:
        return Counter()
    return Counter(state for (state,) in rows)


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(1.0)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def mlflow_runs(study_dir: Path, study_name: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{study_dir / 'mlflow' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(study_name)
    return client.search_runs([experiment.experiment_id], max_results=1000)


def finished_runs(study_dir: Path, study_name: str) -> list:
    return [
        r
        for r in mlflow_runs(study_dir, study_name)
        if r.data.tags.get(schema.TAG_STATUS) in (schema.STATUS_FINISHED, schema.STATUS_DIVERGED)
    ]


def assert_complete(study_dir: Path, study_name: str, expected_results: int) -> None:
    record = json.loads((study_dir / "study.json").read_text())
    runs = finished_runs(study_dir, study_name)
    trials = Counter(r.data.tags[schema.TAG_TRIAL] for r in runs)
    assert all(n == 1 for n in trials.values()), f"duplicated trials: {trials}"
    assert len(runs) == expected_results, (len(runs), expected_results)
    for run in runs:
        missing = [t for t in REQUIRED_TAGS if t not in run.data.tags]
        assert not missing, missing
        assert "final/val_ood_loss" in run.data.metrics
    assert record["trials"]["failed"] == 0
    assert 0 < record["utilization"] <= 1.0


def kill_group(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def test_smoke_study_leaves_one_run_per_trial_and_a_study_per_cell(data_root, tmp_path):
    study_dir = tmp_path / "k2_vs_k3"
    out = run_to_end(K2_VS_K3, study_dir, data_root)
    assert "utilization" in out
    # smoke: 2 cells (k2-t0, k3-t0) x 2 trials, one budget, cosine only.
    assert_complete(study_dir, "k2_vs_k3", expected_results=4)
    assert optuna_counts(study_dir)["COMPLETE"] == 4
    # optuna-dashboard lists every study: none may be empty (no identity holder, no unused
    # study of extra runs; this preset has one seed and no shared arm).
    with sqlite3.connect(f"file:{study_dir / 'optuna.db'}?mode=ro", uri=True) as conn:
        empty = conn.execute(
            "SELECT study_name FROM studies WHERE study_id NOT IN (SELECT study_id FROM trials)"
        ).fetchall()
    assert empty == []
    again = run_to_end(K2_VS_K3, study_dir, data_root)
    assert "already complete" in again


def test_the_ablation_study_runs_every_arm_and_its_report_says_what_it_can_compare(
    data_root, tmp_path
):
    study_dir = tmp_path / "k3_ablations"
    run_to_end(K3_ABLATIONS, study_dir, data_root)
    # smoke: 12 cells (K3, K2 and ten arms at t0) x 2 trials, one budget, cosine only.
    assert_complete(study_dir, "k3_ablations", expected_results=24)
    arms = {r.data.tags[schema.TAG_ARCH] for r in finished_runs(study_dir, "k3_ablations")}
    assert len(arms) == 12 and {"k3", "k2", "adamw", "mla_only"} <= arms
    fit = study_dir / "fit.json"
    done = k3scale_cli(
        "fit", "k3_ablations", "--from", str(study_dir / "tables"), "--out", str(fit)
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(fit.read_text())["results"]
    # Two trials per cell fit no quadratic, so K3 has no optimum to compare with: every cell of
    # every arm is in the table, and the comparison says why it is empty.
    assert {o["cell"]["arch"] for o in results["cell_optima"]} == arms
    why = "k3 has no identified cell optimum with draws"
    assert results["component_effects"]["c_6n"]["skipped"] == why
    report = k3scale_cli(
        "study", "report", str(K3_ABLATIONS), "--preset", "smoke", "--study-dir", str(study_dir),
        "--brief",
    )  # fmt: skip
    assert report.returncode == 0, report.stderr
    assert f"ANSWER: component effects (6ND): not identified ({why})." in report.stdout


def test_driver_sigkill_then_resume_loses_and_duplicates_nothing(data_root, tmp_path):
    study_dir = tmp_path / "cosine_vs_wsd"
    proc = start(COSINE_VS_WSD, study_dir, data_root)
    wait_for(lambda: optuna_counts(study_dir)["COMPLETE"] >= 2, 600, "two finished trials")
    kill_group(proc)
    run_to_end(COSINE_VS_WSD, study_dir, data_root)
    # smoke: 2 budgets x (2 cosine + 2 WSD trials) + 2 shared-arm runs = 10 results.
    assert_complete(study_dir, "cosine_vs_wsd", expected_results=10)


def test_driver_killed_after_its_last_trial_then_rerun_finishes_the_job(data_root, tmp_path):
    """Issue 23: the rerun says "nothing to run" and must still write tables and study.json."""
    study_dir = tmp_path / "k2_vs_k3_last"
    proc = start(K2_VS_K3, study_dir, data_root)
    wait_for(lambda: optuna_counts(study_dir)["COMPLETE"] >= 4, 900, "every trial told")
    kill_group(proc)
    # Whatever the killed driver managed to write after its last trial, the rerun writes again.
    shutil.rmtree(study_dir / "tables", ignore_errors=True)
    (study_dir / "study.json").unlink(missing_ok=True)
    out = run_to_end(K2_VS_K3, study_dir, data_root)
    assert "already complete" in out
    assert (study_dir / "tables" / "runs.parquet").is_file()
    record = json.loads((study_dir / "study.json").read_text())
    assert record["state"] == "complete"
    assert record["trials"]["failed"] == 0 and sum(record["trials"].values()) == 4
    assert len(record["identity"]["git_sha"]) in (40, len("unknown"))
    assert len(finished_runs(study_dir, "k2_vs_k3")) == 4
    assert not [r for r in mlflow_runs(study_dir, "k2_vs_k3") if r.info.status == "RUNNING"]
    # The rerun's tables hold exactly the results the killed driver told Optuna: what an unkilled
    # driver would have exported.
    with sqlite3.connect(f"file:{study_dir / 'optuna.db'}?mode=ro", uri=True) as conn:
        told = sorted(value for (value,) in conn.execute("SELECT value FROM trial_values"))
    tables = pl.read_parquet(study_dir / "tables" / "runs.parquet")
    assert sorted(tables["final_val_ood_loss"].to_list()) == pytest.approx(told, rel=1e-12)
    # The fit and the study's report work from the rerun's folder (issue 23: they had failed).
    fit = ["fit", "k2_vs_k3", "--from", str(study_dir / "tables"), "--bootstrap", "50"]
    fit += ["--out", str(study_dir / "fit.json")]
    report = ["study", "report", str(K2_VS_K3), "--preset", "smoke", "--study-dir", str(study_dir)]
    for command in (fit, report):
        done = k3scale_cli(*command, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "compute multiplier (c_6n)" in done.stdout, done.stdout[-2000:]
    # No link to the report's temporary MLflow server, dead once the report exits.
    assert "View run" not in done.stdout and "k3scale ui --study-dir" in done.stdout
    assert "kernel path: " in done.stdout


def test_trial_worker_sigkill_is_retried_and_the_study_completes(data_root, tmp_path):
    study_dir = tmp_path / "k2_vs_k3_worker"
    proc = start(K2_VS_K3, study_dir, data_root)

    def worker_pids() -> list[int]:
        listing = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
        return [
            int(line.split()[0])
            for line in listing.splitlines()
            if "ray::_run_payload_entry" in line
        ]

    wait_for(lambda: bool(worker_pids()), 600, "a trial running in a Ray worker")
    time.sleep(2.0)
    victims = worker_pids()
    os.kill(victims[0], signal.SIGKILL)
    assert proc.wait(timeout=900) == 0
    assert_complete(study_dir, "k2_vs_k3", expected_results=4)


def test_mlflow_server_stopped_mid_study_loses_nothing(data_root, tmp_path):
    study_dir = tmp_path / "k2_vs_k3_server"
    proc = start(K2_VS_K3, study_dir, data_root)
    record = study_dir / "mlflow" / "server.json"
    wait_for(lambda: optuna_counts(study_dir)["COMPLETE"] >= 1 and record.exists(), 600, "a trial")
    server_pid = json.loads(record.read_text())["pid"]
    os.killpg(server_pid, signal.SIGKILL)
    assert proc.wait(timeout=900) == 0
    log = (study_dir.parent / f"{study_dir.name}.log").read_text()
    assert "restarting it on the same database" in log
    assert_complete(study_dir, "k2_vs_k3", expected_results=4)
    runs = json.loads((study_dir / "study.json").read_text())
    assert runs["trials"]["finished"] == 4


def test_a_study_copies_the_runs_another_folder_trained_instead_of_training_them(
    data_root, tmp_path
):
    """Issue 34: `--reuse-runs DIR` copies every run whose config, commit, kernel path and data
    match (a WSD trunk with its branches), tells its result, and trains nothing again."""
    first, second = tmp_path / "first", tmp_path / "second"
    run_to_end(COSINE_VS_WSD, first, data_root)
    out = run_to_end(COSINE_VS_WSD, second, data_root, "--reuse-runs", str(first))
    source = {r.info.run_id: r for r in finished_runs(first, "cosine_vs_wsd")}
    copies = finished_runs(second, "cosine_vs_wsd")
    assert len(copies) == len(source) and "reused first/" in out
    assert not (second / "runs").exists(), "a run was trained again"
    ids = {r.info.run_id for r in copies}
    for run in copies:
        folder, run_id = run.data.tags[schema.TAG_REUSED_FROM].split("/")
        original = source[run_id]
        assert folder == "first"
        assert run.data.metrics == original.data.metrics
        assert run.data.tags[schema.TAG_CONFIG_HASH] == original.data.tags[schema.TAG_CONFIG_HASH]
        if schema.TAG_TRUNK_RUN_ID in original.data.tags:
            # A branch hangs under the copy of its trunk, in this study.
            assert run.data.tags[schema.MLFLOW_PARENT_RUN_ID] in ids
            assert run.data.tags[schema.TAG_TRUNK_RUN_ID] in ids
    record = json.loads((second / "study.json").read_text())
    assert record["reused_runs"] == len(source)
    assert record["trials"] == json.loads((first / "study.json").read_text())["trials"]
    table = pl.read_parquet(second / "tables" / "runs.parquet")
    assert table["reused_from"].null_count() == 0
