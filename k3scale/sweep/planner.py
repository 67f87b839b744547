"""Expand a study and a preset into cells, and a cell's trial into a RunConfig.

A cell is (arch, size, budget, schedule): one tuning problem with its own Optuna study. Warmup is
one absolute token count per preset (a fraction of the smallest budget), so both schedules at a
cell warm up alike and WSD branches of different budgets share their trunk's LR up to the fork.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from k3scale.config import (
    DataConfig,
    OptimConfig,
    RunConfig,
    ScheduleConfig,
    TrackConfig,
    TrainConfig,
)
from k3scale.models import accounting
from k3scale.models.presets import get_preset
from k3scale.sweep.declaration import Study, StudyPreset
from k3scale.track import schema


@dataclass(frozen=True, kw_only=True)
class Cell:
    arch: str
    """Architecture family (k2 or k3)."""
    size: str
    """Model preset name."""
    budget_tokens: int
    """Training tokens D."""
    schedule: str
    """cosine or wsd."""

    @property
    def key(self) -> str:
        """Stable name of the cell: its Optuna study name and MLflow tag."""
        return f"{self.size}|D{self.budget_tokens}|{self.schedule}"

    @property
    def slug(self) -> str:
        """File-system safe key."""
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", self.key)


def plan_cells(study: Study, preset: StudyPreset) -> list[Cell]:
    """Every (arch, size, budget, schedule) of the study, cheapest first."""
    cells = [
        Cell(arch=arch, size=size, budget_tokens=budget, schedule=schedule)
        for arch in study.archs
        for size in preset.sizes[arch]
        for budget in preset.budgets
        for schedule in study.schedules
    ]
    return sorted(cells, key=lambda c: (cell_flops(c, preset), c.key))


def cell_flops(cell: Cell, preset: StudyPreset) -> int:
    """Training compute of one trial of the cell (attention-inclusive FLOPs)."""
    model = get_preset(cell.size)
    return accounting.flops_per_token(model, preset.seq_len) * cell.budget_tokens


def warmup_tokens(preset: StudyPreset) -> int:
    """One warmup length for every cell and both schedules."""
    return round(preset.warmup_fraction * min(preset.budgets))


def trial_config(
    study: Study,
    preset: StudyPreset,
    cell: Cell,
    *,
    lr: float,
    batch_size: int,
    seed: int,
    out_dir: str,
    data_root: str,
    tracking_uri: str | None,
    dataset: str = "english_mix",
    tags: dict[str, str],
    study_dir: str | None = None,
) -> RunConfig:
    """The RunConfig of one trial of `cell` at (lr, batch_size, seed); `study_dir` is the folder
    its logged paths are relative to."""
    model = get_preset(cell.size)
    all_tags = {
        schema.TAG_STUDY: study.name,
        schema.TAG_CELL: cell.key,
        schema.TAG_ARCH: cell.arch,
        schema.TAG_SIZE: cell.size,
        schema.TAG_SCHEDULE: cell.schedule,
        schema.TAG_BUDGET_TOKENS: str(cell.budget_tokens),
        **tags,
    }
    return RunConfig(
        model=model,
        data=DataConfig(
            dataset=dataset, root=data_root, seq_len=preset.seq_len, eval_tokens=preset.eval_tokens
        ),
        optim=OptimConfig(lr=lr, per_head_muon=cell.arch == "k3"),
        schedule=ScheduleConfig(
            kind=cell.schedule,
            warmup_tokens=warmup_tokens(preset),
            lr_min=preset.lr_min,
            decay_fraction=preset.wsd_decay_fraction,
            decay_shape=preset.wsd_decay_shape,
        ),
        train=TrainConfig(
            budget_tokens=cell.budget_tokens,
            batch_size=batch_size,
            micro_batch_size=min(preset.micro_batch_size, batch_size),
            seed=seed,
            precision=preset.precision,
            eval_interval_tokens=cell.budget_tokens // max(preset.eval_points, 1),
            # A killed worker's retry resumes from the last quarter, not from scratch.
            checkpoint_interval_tokens=cell.budget_tokens // 4,
            out_dir=out_dir,
            num_threads=preset.threads_per_trial,
        ),
        track=TrackConfig(
            tracking_uri=tracking_uri,
            experiment=study.name,
            paths_relative_to=study_dir,
            run_name=f"{cell.key}|lr{lr:.3g}|b{batch_size}|s{seed}",
            tags=tuple(sorted(all_tags.items())),
        ),
    )


def estimate_cost(study: Study, preset: StudyPreset) -> dict[str, float]:
    """Trials, tokens and FLOPs the preset will spend (WSD trunks counted once)."""
    cells = plan_cells(study, preset)
    tuned = len(cells) * preset.trials_per_cell
    tokens = 0
    flops = 0
    for cell in cells:
        per_trial = cell.budget_tokens
        if (
            cell.schedule == "wsd"
            and preset.share_wsd_trunks
            and cell.budget_tokens != max(preset.budgets)
        ):
            per_trial = round(preset.wsd_decay_fraction * cell.budget_tokens)
        tokens += per_trial * preset.trials_per_cell
        flops += per_trial * preset.trials_per_cell * cell_flops(cell, preset) // cell.budget_tokens
    baseline = study.schedules[0]
    shared = sum(cell.schedule != baseline for cell in cells) if study.shared_arm else 0
    extra_runs = len(cells) * (len(preset.seeds) - 1) + shared
    return {
        "cells": len(cells),
        "tuning_trials": tuned,
        "extra_runs": extra_runs,
        "tokens": tokens,
        "flops": flops,
    }
