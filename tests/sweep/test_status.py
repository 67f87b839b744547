"""`study status` from a real Optuna storage: each arm's cells together, and each best trial's
peak LR and batch (issue 37: cells were interleaved and the best LR was not shown)."""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution

from k3scale.sweep.declaration import load_study
from k3scale.sweep.planner import plan_cells
from k3scale.sweep.status import study_status

ROOT = Path(__file__).resolve().parents[2]
LR = FloatDistribution(1e-4, 1.0, log=True)
BATCH = CategoricalDistribution([7])


def test_status_groups_each_arms_cells_and_names_the_best_trials_lr(tmp_path):
    study = load_study(ROOT / "experiments" / "cosine_vs_wsd.py")
    preset = study.preset("cpu_v3")
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    cells = plan_cells(study, preset)
    first = cells[0]
    tuned = optuna.create_study(study_name=first.key, storage=storage)
    for lr, loss in ((0.0074, 4.41), (0.0119, 4.37), (0.019, 4.39)):
        trial = optuna.trial.create_trial(
            params={"lr": lr, "batch_size": 7},
            distributions={"lr": LR, "batch_size": BATCH},
            value=loss,
        )
        tuned.add_trial(trial)
    lines = study_status(study, preset, storage).splitlines()
    assert "at peak lr, batch" in lines[0]
    (row,) = [line for line in lines if line.startswith(first.key)]
    assert row.split()[1:4] == ["3", "0", "0"] and "4.3700  (lr 0.0119, batch 7)" in row
    listed = [line.split()[0] for line in lines[1:-1]]
    schedules = [key.rsplit("|", 1)[1] for key in listed]
    # Every cosine cell before every WSD cell, not alternating.
    assert schedules == sorted(schedules) and len(listed) == len(cells)


def test_a_cells_studies_name_their_objective(tmp_path):
    from k3scale.sweep import sources

    study = load_study(ROOT / "experiments" / "k2_vs_k3.py")
    cell = plan_cells(study, study.preset("cpu_v3"))[0]
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    metric = f"final_{study.objective}"
    tuning = sources.open_cell_study(storage, cell, seed=3, sampled=False, metric=metric)
    extra = sources.open_extra_study(storage, cell, metric=metric)
    assert tuning.metric_names == ["final_val_ood_loss"] and extra.metric_names == [metric]
    again = optuna.load_study(study_name=cell.key, storage=storage)
    assert again.metric_names == [metric]


def test_status_counts_the_re_runs_so_its_totals_add_up(tmp_path):
    from k3scale.sweep import sources

    study = load_study(ROOT / "experiments" / "k2_vs_k3.py")
    preset = study.preset("cpu_v3")
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    cell = plan_cells(study, preset)[0]
    tuned = optuna.create_study(study_name=cell.key, storage=storage)
    for lr, loss in ((0.0074, 4.41), (0.0119, 4.37)):
        tuned.add_trial(
            optuna.trial.create_trial(params={"lr": lr}, distributions={"lr": LR}, value=loss)
        )
    extra = sources.open_extra_study(storage, cell)
    for seed in (4, 5):
        extra.add_trial(
            optuna.trial.create_trial(
                params={"lr": 0.0119}, distributions={"lr": LR}, value=4.36 + seed / 1000
            )
        )
    lines = study_status(study, preset, storage).splitlines()
    assert lines[0].split()[1:5] == ["done", "fail", "run", "extra"]
    (row,) = [line for line in lines if line.startswith(cell.key)]
    assert row.split()[1:5] == ["2", "0", "0", "2"]
    assert lines[-1].split()[1:5] == ["2", "0", "0", "2"] and "(4 finished)" in lines[-1]
