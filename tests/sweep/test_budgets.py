"""Budgets in tokens per active parameter (StudyPreset.budgets_per_param) and the v2 presets."""

from __future__ import annotations

import dataclasses
import math

import pytest

from k3scale.errors import K3ScaleError
from k3scale.models import accounting
from k3scale.models.presets import get_preset
from k3scale.sweep.declaration import load_study
from k3scale.sweep.planner import plan_cells, trial_config, warmup_tokens
from tests.sweep.test_study_runs import COSINE_VS_WSD, K2_VS_K3


@pytest.mark.parametrize("path", [COSINE_VS_WSD, K2_VS_K3])
def test_v2_presets_meet_the_design_rules(path):
    # Issue 20: every size from <= 10 to >= 20 tokens per active parameter, >= 150 optimizer
    # steps in every run, >= 256-token sequences, 3 seeds, an LR grid no coarser than 1.6x.
    study = load_study(path)
    preset = study.preset("cpu_v2")
    assert preset.seq_len >= 256 and len(preset.seeds) >= 3 and preset.lr_grid.ratio <= 1.6
    step_tokens = preset.lr_grid.batch_size * preset.seq_len
    for size in (s for sizes in preset.sizes.values() for s in sizes):
        budgets = preset.budgets_for(size)
        per_param = [b / accounting.num_params_active(get_preset(size)) for b in budgets]
        assert min(per_param) <= 10.2 and max(per_param) >= 19.8, (size, per_param)
        assert all(b % step_tokens == 0 and b // step_tokens >= 150 for b in budgets)
    cells = plan_cells(study, preset)
    assert {c.budget_tokens for c in cells if c.size == "k3-s1"} == set(preset.budgets_for("k3-s1"))


def test_warmup_is_one_length_per_size_for_both_schedules():
    study = load_study(COSINE_VS_WSD)
    preset = study.preset("cpu_v2")
    configs = [
        trial_config(
            study,
            preset,
            cell,
            lr=1e-2,
            batch_size=8,
            seed=0,
            out_dir="x",
            data_root="d",
            dataset="english_mix_v512",
            tracking_uri="",
            tags={},
            study_dir="s",
        )
        for cell in plan_cells(study, preset)
        if cell.size == "k3-s2"
    ]
    assert {c.schedule.warmup_tokens for c in configs} == {warmup_tokens(preset, "k3-s2")}
    assert warmup_tokens(preset, "k3-s2") == round(0.1 * min(preset.budgets_for("k3-s2")))


def test_budgets_per_param_must_be_positive():
    preset = load_study(K2_VS_K3).preset("cpu_v2")
    with pytest.raises(K3ScaleError, match="budgets_per_param"):
        dataclasses.replace(preset, budgets_per_param=(10.0, -1.0))
    # Without them the fixed budgets serve every size.
    fixed = dataclasses.replace(preset, budgets_per_param=(), budgets=(4096, 8192))
    assert fixed.budgets_for("k2-s3") == (4096, 8192)
    assert math.isclose(
        preset.budgets_for("k2-s3")[1] / preset.budgets_for("k2-s3")[0], 2, rel_tol=0.01
    )


@pytest.mark.parametrize("batch", [4, 7, 12])
def test_the_batch_check_presets_change_only_the_batch_of_one_cpu_v2_cell(batch):
    # Issue 20's sensitivity check of the fixed batch: cpu_v2's k3-s1 at 20 tokens per parameter,
    # the same warmup tokens, LR grid and seeds, >= 150 steps; budgets within 0.1% of cpu_v2's.
    study = load_study(K2_VS_K3)
    v2, check = study.preset("cpu_v2"), study.preset(f"cpu_v2_b{batch}")
    (cell,) = plan_cells(study, check)
    assert (cell.arch, cell.size, cell.schedule) == ("k3", "k3-s1", "wsd")
    assert math.isclose(cell.budget_tokens, v2.budgets_for("k3-s1")[1], rel_tol=1e-3)
    assert cell.budget_tokens // (batch * check.seq_len) >= 150
    assert warmup_tokens(check, "k3-s1") == warmup_tokens(v2, "k3-s1")
    grid = dataclasses.replace(check.lr_grid, batch_size=v2.lr_grid.batch_size)
    assert grid.for_size("k3-s1") == v2.lr_grid.for_size("k3-s1")
    assert (check.seeds, check.dataset, check.seq_len) == (v2.seeds, v2.dataset, v2.seq_len)
    assert check.lr_grid.batch_size == check.micro_batch_size == batch
    if batch == 7:
        assert cell.budget_tokens == v2.budgets_for("k3-s1")[1]
