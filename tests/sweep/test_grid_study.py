"""A whole grid-tuned study (issue 20, point 3) on a real local Ray, MLflow and Optuna.

Its 3-point grid sits far below the LRs these models train best at, so every cell's best is the
grid's top and the driver must add an LR above it; each schedule keeps its own studies, WSD
shares one trunk across both budgets, and the best point of every cell is re-run with seed 1.
"""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import optuna
import polars as pl
import pytest
from optuna.trial import TrialState

from k3scale.sweep.declaration import LRGrid
from k3scale.sweep.grid import grid_lrs
from k3scale.viz.summaries import grid_shared_runs
from tests.sweep.test_study_runs import data_root, study_command  # noqa: F401  (fixture)

pytestmark = [pytest.mark.slow, pytest.mark.ray]

ROOT = Path(__file__).resolve().parents[2]
GRID = LRGrid(center=1.5e-3, points=3, max_extensions=1, batch_size=8)
GRID_STUDY = f"""
from k3scale.sweep.declaration import LRGrid, SearchSpace, Study, StudyPreset

SMOKE = StudyPreset(
    sizes={{"k2": ("k2-t0",)}},
    budgets=(8_192, 16_384),
    search=SearchSpace(lr_low=2e-3, lr_high=6e-2, batch_sizes=(8,)),
    trials_per_cell=1,
    lr_grid={GRID!r},
    seeds=(0, 1),
    seq_len=64,
    eval_tokens=4_096,
    eval_points=1,
    micro_batch_size=8,
)
STUDY = Study(
    name="grid",
    archs=("k2",),
    schedules=("cosine", "wsd"),
    shared_arm=True,
    presets={{"smoke": SMOKE}},
)
"""
CELLS = [
    f"k2-t0|D{budget}|{schedule}" for budget in (8_192, 16_384) for schedule in ("cosine", "wsd")
]


def test_a_grid_centred_too_low_is_extended_in_every_cell(data_root, tmp_path):  # noqa: F811
    study = tmp_path / "grid.py"
    study.write_text(GRID_STUDY)
    study_dir = tmp_path / "study"
    done = subprocess.run(
        study_command(study, study_dir, data_root),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    storage = f"sqlite:///{study_dir / 'optuna.db'}"
    grid = grid_lrs(GRID)
    best = {}
    for cell in CELLS:
        trials = optuna.load_study(study_name=cell, storage=storage).get_trials(
            states=(TrialState.COMPLETE,)
        )
        lrs = sorted(t.params["lr"] for t in trials)
        assert all(any(math.isclose(lr, g, rel_tol=1e-9) for lr in lrs) for g in grid), (cell, lrs)
        assert lrs[-1] == pytest.approx(grid[-1] * GRID.ratio, rel=1e-9), (cell, lrs)
        best[cell] = min(trials, key=lambda t: t.value).params["lr"]
    runs = pl.read_parquet(study_dir / "tables" / "runs.parquet")
    for cell in CELLS:
        reruns = runs.filter((pl.col("cell") == cell) & (pl.col("arm") == "seed"))
        assert reruns["seed"].to_list() == [1], cell
        assert reruns["lr"][0] == pytest.approx(best[cell], rel=1e-9), cell
    # On one grid the shared setting is WSD's own grid trial at cosine's best: no extra runs.
    assert runs.filter(pl.col("arm") == "shared").is_empty()
    shared = grid_shared_runs(runs, "final_val_ood_loss")
    assert sorted(shared["cell"].to_list()) == sorted(c for c in CELLS if c.endswith("wsd"))
    for row in shared.iter_rows(named=True):
        assert row["lr"] == pytest.approx(best[row["cell"].replace("wsd", "cosine")], rel=1e-9)
    assert set(runs["batch_size"].to_list()) == {GRID.batch_size}
