"""Every study declaration imports, and every cell of every preset builds a valid RunConfig."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from k3scale.config import config_hash
from k3scale.errors import K3ScaleError
from k3scale.models import accounting
from k3scale.sweep.declaration import load_study
from k3scale.sweep.planner import estimate_cost, plan_cells, trial_config, warmup_tokens
from k3scale.train import plan_run

ROOT = Path(__file__).resolve().parents[2]
STUDY_FILES = sorted((ROOT / "experiments").glob("*.py"))
PRESETS = ("smoke", "demo", "cpu", "gpu", "cluster")


def test_there_are_two_flagship_studies():
    names = {load_study(path).name for path in STUDY_FILES if path.name != "__init__.py"}
    assert {"cosine_vs_wsd", "k2_vs_k3"} <= names


@pytest.mark.parametrize(
    "path", [p for p in STUDY_FILES if p.name != "__init__.py"], ids=lambda p: p.stem
)
def test_every_cell_of_every_preset_builds(path):
    study = load_study(path)
    assert set(PRESETS) <= set(study.presets)
    for name in PRESETS:
        preset = study.preset(name)
        cells = plan_cells(study, preset)
        assert len({c.key for c in cells}) == len(cells) > 0
        lo, hi = preset.search.lr_low, preset.search.lr_high
        for cell in cells:
            cfg = trial_config(
                study,
                preset,
                cell,
                lr=(lo * hi) ** 0.5,
                batch_size=(
                    preset.lr_grid.batch_size if preset.lr_grid else max(preset.search.batch_sizes)
                ),
                seed=0,
                out_dir="/tmp/x",
                data_root="/tmp/data",
                tracking_uri=None,
                tags={},
            )
            plan = plan_run(cfg)
            assert plan.lrs[-1] == preset.lr_min
            assert cfg.schedule.warmup_tokens == warmup_tokens(preset, cell.size)
            assert accounting.flops_per_token(cfg.model, cfg.data.seq_len) > 0
            assert len(config_hash(cfg)) == 16
        assert estimate_cost(study, preset)["tuning_trials"] == len(cells) * preset.trials_per_cell


def test_cosine_vs_wsd_tunes_both_schedules_and_keeps_a_shared_arm():
    study = load_study(ROOT / "experiments" / "cosine_vs_wsd.py")
    assert study.schedules == ("cosine", "wsd") and study.shared_arm
    for name in PRESETS:
        preset = study.preset(name)
        schedules = {c.schedule for c in plan_cells(study, preset)}
        assert schedules == {"cosine", "wsd"}


def test_a_malformed_study_file_is_one_clear_error(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("STUDY = Study(\n")
    with pytest.raises(K3ScaleError, match="cannot be loaded: SyntaxError"):
        load_study(bad)
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(K3ScaleError, match="must define STUDY"):
        load_study(empty)
    with pytest.raises(K3ScaleError, match="does not exist"):
        load_study(tmp_path / "missing.py")


def test_unknown_preset_names_the_valid_ones():
    study = load_study(ROOT / "experiments" / "k2_vs_k3.py")
    with pytest.raises(K3ScaleError, match=r"has no preset 'huge'.*smoke"):
        study.preset("huge")


def test_k2_vs_k3_v2_runs_on_wsd_trunks_and_a_schedule_study_cannot_drop_one():
    study = load_study(ROOT / "experiments" / "k2_vs_k3.py")
    v2 = study.preset("cpu_v2")
    assert {cell.schedule for cell in plan_cells(study, v2)} == {"wsd"}
    assert {cell.schedule for cell in plan_cells(study, study.preset("cpu"))} == {"cosine"}
    # Two budgets per size on one trunk: a tuning trial's tokens are the trunk plus a branch.
    assert (
        estimate_cost(study, v2)["tokens"]
        < 0.8
        * sum(cell.budget_tokens for cell in plan_cells(study, v2))
        * v2.planned_trials_per_cell
    )

    schedules = load_study(ROOT / "experiments" / "cosine_vs_wsd.py")
    with pytest.raises(K3ScaleError, match="compares schedules: every preset must run all"):
        dataclasses.replace(
            schedules,
            presets={"x": dataclasses.replace(schedules.preset("smoke"), schedules=("wsd",))},
        )
