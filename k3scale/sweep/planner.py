"""Expand a study and a preset into cells, and a cell's trial into a RunConfig.

A cell is (arch, size, budget, schedule): one tuning problem with its own Optuna study. Warmup is
one absolute token count per preset (a fraction of the smallest budget), so both schedules at a
cell warm up alike and WSD branches of different budgets share their trunk's LR up to the fork.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from k3scale.config import (
    DataConfig,
    OptimConfig,
    RunConfig,
    ScheduleConfig,
    TrackConfig,
    TrainConfig,
    apply_overrides,
)
from k3scale.errors import K3ScaleError
from k3scale.models import accounting
from k3scale.models.presets import get_preset
from k3scale.sweep.declaration import Arch, Study, StudyPreset
from k3scale.track import schema

# Committed study results (run tables with per-step tokens/s and MFU) the wall-clock estimate of
# `k3scale study plan` is fitted to.
MEASURED_STUDIES = Path(__file__).resolve().parents[2] / "analysis" / "results"


@dataclass(frozen=True, kw_only=True)
class Cell:
    arch: str
    """Architecture family (k2 or k3), or an arm's name (`Study.arms`)."""
    size: str
    """Model preset name."""
    budget_tokens: int
    """Training tokens D."""
    schedule: str
    """cosine or wsd."""

    @property
    def family(self) -> str:
        """k2 or k3: the family of its size (an arm's cells carry the arm's name as arch)."""
        return get_preset(self.size).family

    @property
    def key(self) -> str:
        """Stable name of the cell: its Optuna study name and MLflow tag (an arm's cells are
        prefixed with the arm: its sizes are its family's)."""
        arm = "" if self.arch in get_args(Arch) else f"{self.arch}@"
        return f"{arm}{self.size}|D{self.budget_tokens}|{self.schedule}"

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
        for budget in preset.budgets_for(size)
        for schedule in study.schedules_of(preset)
    ]
    _check_arms(study, preset)
    return sorted(cells, key=lambda c: (cell_flops(study, c, preset), c.key))


def _check_arms(study: Study, preset: StudyPreset) -> None:
    """Every arm's switches name real config fields with valid values: one clear error before
    anything runs, not a failed trial per cell."""
    for arm in study.arms:
        if arm.name not in study.archs or not preset.sizes.get(arm.name):
            continue
        size = preset.sizes[arm.name][0]
        cell = Cell(arch=arm.name, size=size, budget_tokens=1, schedule=study.schedules[0])
        try:
            trial_config(
                study,
                preset,
                cell,
                lr=1e-3,
                batch_size=1,
                seed=0,
                out_dir=".",
                data_root=".",
                tracking_uri=None,
                tags={},
            )
        except K3ScaleError as exc:
            raise K3ScaleError(f"study {study.name}: arm {arm.name}: {exc}") from None


def cell_model(study: Study, cell: Cell):
    """The cell's model config: its size's preset with its arm's `model.*` switches (and the
    arm's width matched to the preset's active parameters, when it says so)."""
    switches = [
        o.removeprefix("model.") for o in study.overrides(cell.arch) if o.startswith("model.")
    ]
    preset = get_preset(cell.size)
    model = apply_overrides(preset, switches)
    width = study.matched_by(cell.arch)
    if width is None:
        return model
    return accounting.with_active_params(
        model, width.removeprefix("model."), accounting.num_params_active(preset)
    )


def cell_flops(study: Study, cell: Cell, preset: StudyPreset) -> int:
    """Training compute of one trial of the cell (attention-inclusive FLOPs)."""
    model = cell_model(study, cell)
    return accounting.flops_per_token(model, preset.seq_len) * cell.budget_tokens


def warmup_tokens(preset: StudyPreset, size: str) -> int:
    """One warmup length for every cell of a size and both schedules (its smallest budget's
    fraction; with fixed budgets, one length for the whole study)."""
    return round(preset.warmup_fraction * min(preset.budgets_for(size)))


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
    model = cell_model(study, cell)
    all_tags = {
        schema.TAG_STUDY: study.name,
        schema.TAG_CELL: cell.key,
        schema.TAG_ARCH: cell.arch,
        schema.TAG_SIZE: cell.size,
        schema.TAG_SCHEDULE: cell.schedule,
        schema.TAG_BUDGET_TOKENS: str(cell.budget_tokens),
        **tags,
    }
    config = RunConfig(
        model=model,
        data=DataConfig(
            dataset=dataset, root=data_root, seq_len=preset.seq_len, eval_tokens=preset.eval_tokens
        ),
        optim=OptimConfig(lr=lr, per_head_muon=cell.family == "k3"),
        schedule=ScheduleConfig(
            kind=cell.schedule,
            warmup_tokens=warmup_tokens(preset, cell.size),
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
            compile=preset.compile,
            device=preset.device,
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
    # An arm's other switches (the optimizer's): its family's trial with them applied.
    return apply_overrides(
        config, [o for o in study.overrides(cell.arch) if not o.startswith("model.")]
    )


def estimate_cost(study: Study, preset: StudyPreset) -> dict[str, float]:
    """Trials, tokens and FLOPs the preset will spend (WSD trunks counted once; an LR grid's
    points, not its extensions)."""
    cells = plan_cells(study, preset)
    trials = preset.planned_trials_per_cell
    tuned = len(cells) * trials
    tokens = 0
    flops = 0
    for cell in cells:
        per_trial = cell.budget_tokens
        if (
            cell.schedule == "wsd"
            and preset.share_wsd_trunks
            and cell.budget_tokens != max(preset.budgets_for(cell.size))
        ):
            per_trial = round(preset.wsd_decay_fraction * cell.budget_tokens)
        tokens += per_trial * trials
        flops += per_trial * trials * cell_flops(study, cell, preset) // cell.budget_tokens
    baseline = study.schedules_of(preset)[0]
    shared = (
        sum(cell.schedule != baseline for cell in cells) if runs_shared_arm(study, preset) else 0
    )
    extra_runs = len(cells) * (len(preset.seeds) - 1) + shared
    return {
        "cells": len(cells),
        "tuning_trials": tuned,
        "extra_runs": extra_runs,
        "tokens": tokens,
        "flops": flops,
    }


@dataclass(frozen=True, kw_only=True)
class ThroughputModel:
    """Seconds per training token of a trial as `per_token_s + F / flops_per_s + N / B *
    step_s_per_param` (per arch): F the attention-inclusive FLOPs per token, N the total
    parameters, B the tokens per step (the optimizer's per-step work is spread over B), plus
    `trial_overhead_s` per trial (start, evaluations, checkpoints); measured on a machine whose
    fp32 matmul peak per trial was `peak_flops`, and scaled by the ratio of peaks elsewhere."""

    per_token_s: dict[str, float]
    flops_per_s: dict[str, float]
    step_s_per_param: dict[str, float]
    trial_overhead_s: float
    peak_flops: float
    num_runs: int
    source: str


def measured_throughput(results: Path = MEASURED_STUDIES) -> ThroughputModel | None:
    """Fit the model to the committed studies' runs: each run's median `perf/tokens_per_s` and
    `perf/mfu` (its peak is tokens/s x F / MFU), least squares per arch, and the per-trial
    overhead from each study.json's busy trial time beyond its runs' training time."""
    import json

    import numpy as np
    import polars as pl

    tables, overhead_s, num_trials = [], 0.0, 0
    for folder in sorted(p for p in results.glob("*") if (p / "runs.parquet").is_file()):
        runs = pl.read_parquet(folder / "runs.parquet")
        rates = (
            pl.read_parquet(folder / "curves.parquet")
            .filter(pl.col("metric").is_in(["perf/tokens_per_s", "perf/mfu"]))
            .group_by("run_id", "metric")
            .agg(pl.col("value").median())
            .pivot(on="metric", index="run_id", values="value")
        )
        table = runs.join(rates, on="run_id").select(
            "arch",
            "tokens",
            F="flops_per_token_attn",
            NB=pl.col("n_total") / pl.col("batch_tokens"),
            tps="perf/tokens_per_s",
            mfu="perf/mfu",
        )
        record = folder / "study.json"
        if record.is_file():
            busy = json.loads(record.read_text()).get("busy_trial_s", 0.0)
            overhead_s += busy - float((table["tokens"] / table["tps"]).sum())
            num_trials += table.height
        tables.append(table)
    if not tables:
        return None
    table = pl.concat(tables)
    per_token, rate, per_param = {}, {}, {}
    for arch in table["arch"].unique().sort().to_list():
        rows = table.filter(pl.col("arch") == arch)
        design = np.c_[np.ones(rows.height), rows["F"].to_numpy(), rows["NB"].to_numpy()]
        coef = np.linalg.lstsq(design, 1 / rows["tps"].to_numpy(), rcond=None)[0]
        per_token[arch], rate[arch], per_param[arch] = float(coef[0]), 1 / coef[1], coef[2]
    return ThroughputModel(
        per_token_s=per_token,
        flops_per_s=rate,
        step_s_per_param={k: float(v) for k, v in per_param.items()},
        trial_overhead_s=max(0.0, overhead_s / num_trials) if num_trials else 0.0,
        peak_flops=float((table["tps"] * table["F"] / table["mfu"]).median()),
        num_runs=table.height,
        source=str(results),
    )


def estimate_wall_s(
    study: Study, preset: StudyPreset, model: ThroughputModel, peak_flops: float, slots: int
) -> float:
    """Seconds the study's trials take on `slots` parallel trials of a machine with this
    fp32 matmul peak per trial: every trial's modelled time, spread evenly over the slots."""
    scale = model.peak_flops / peak_flops
    batches = (preset.lr_grid.batch_size,) if preset.lr_grid else preset.search.batch_sizes
    total = 0.0
    for cell, tokens, count in _trial_tokens(study, preset):
        if cell.family not in model.per_token_s:
            raise K3ScaleError(f"no measured throughput of {cell.family} runs in {model.source}")
        size = cell_model(study, cell)
        flops = accounting.flops_per_token(size, preset.seq_len)
        # Batch sizes are searched uniformly (a grid has one): the mean of N / B over them.
        inverse_batch = sum(1 / (b * preset.seq_len) for b in batches) / len(batches)
        per_token = (
            model.per_token_s[cell.family]
            + flops / model.flops_per_s[cell.family]
            + accounting.num_params_total(size)
            * inverse_batch
            * model.step_s_per_param[cell.family]
        )
        total += count * (tokens * per_token + model.trial_overhead_s) * scale
    return total / max(1, slots)


# Seconds a trial costs beyond its training steps and evaluations (process start, model build,
# checkpoints, MLflow): `k3scale bench sweep` on the 2-core machine measured a median of 1.3 s
# and a maximum of 9 s (a fresh worker's first trial) in the eighth sitting.
FIXED_TRIAL_S = 2.0
# An evaluation token costs about a third of a training token (forward only).
EVAL_TOKEN_COST = 1 / 3


def estimate_wall_s_at_rates(
    study: Study, preset: StudyPreset, rates: dict[str, float], slots: int
) -> float:
    """Seconds the study's trials take on `slots` parallel trials, each size training at
    `rates[size]` tokens/s (measured now, `sweep/rates.py`): training, evaluations (every split,
    `eval_points` times plus the final one) and `FIXED_TRIAL_S`, spread evenly over the slots."""
    eval_tokens = 2 * (preset.eval_points + 1) * preset.eval_tokens * EVAL_TOKEN_COST
    total = 0.0
    for cell, tokens, count in _trial_tokens(study, preset):
        total += count * ((tokens + eval_tokens) / rates[cell.size] + FIXED_TRIAL_S)
    return total / max(1, slots)


def runs_shared_arm(study: Study, preset: StudyPreset) -> bool:
    """Whether the shared arm needs runs of its own. On an LR grid it does not: every schedule
    runs the same LRs at one batch, so the other schedule's grid trial at the baseline's best LR
    is the shared setting (issue 20: the shared-setting comparison reads off the same grid)."""
    return study.shared_arm and preset.lr_grid is None


def _trial_tokens(study: Study, preset: StudyPreset):
    """(cell, tokens of one trial, trials) of tuning, seed re-runs and the shared arm."""
    baseline = study.schedules_of(preset)[0]
    for cell in plan_cells(study, preset):
        tokens = cell.budget_tokens
        trunk = max(preset.budgets_for(cell.size))
        if cell.schedule == "wsd" and preset.share_wsd_trunks and tokens != trunk:
            tokens = round(preset.wsd_decay_fraction * tokens)  # a branch off a shared trunk
        yield cell, tokens, preset.planned_trials_per_cell
        extra = (
            len(preset.seeds) - 1 + (runs_shared_arm(study, preset) and cell.schedule != baseline)
        )
        yield cell, cell.budget_tokens, extra
