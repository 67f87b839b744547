"""Training tokens per second of a study preset's rungs, measured now on this machine, for
`k3scale study plan --measure`.

For each size the preset lists, the real trainer runs the first trial of the size's cheapest
cell (the grid's centre LR, seed 0, the preset's batch, sequence length, threads and dataset) for
a few steps, logging to a throwaway replica only; its `tokens_per_s` (the steps alone, setup and
evaluation excluded) is the rate. Solo rates: two trials sharing the machine may each run somewhat
slower, so the wall-clock they give is a lower bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from tempfile import TemporaryDirectory

from k3scale.sweep.declaration import Study, StudyPreset
from k3scale.sweep.planner import plan_cells, trial_config

MEASURED_STEPS = 16
# Steps trained and thrown away first: a process's first steps pay one-off costs (kernel
# libraries loaded, the dataset paged in, allocator growth) that once made a 16-step rate 20x
# too slow; a study's trials pay them once per worker, not per step.
WARMUP_STEPS = 2


def preset_batch(preset: StudyPreset) -> int:
    """Sequences per step of the preset's trials: its grid's batch, else the middle searched."""
    if preset.lr_grid is not None:
        return preset.lr_grid.batch_size
    batches = sorted(preset.search.batch_sizes)
    return batches[len(batches) // 2]


def preset_lr(preset: StudyPreset) -> float:
    """A representative peak LR: the grid's centre, else the search range's geometric middle."""
    if preset.lr_grid is not None:
        return preset.lr_grid.center
    return math.sqrt(preset.search.lr_low * preset.search.lr_high)


def rung_rates(
    study: Study,
    preset: StudyPreset,
    *,
    data_root: str,
    dataset: str,
    progress: Callable[[str], None] = print,
) -> dict[str, float]:
    """size -> training tokens per second of one trial, for every size the preset lists."""
    from k3scale.train.loop import train

    first_cell = {}
    for cell in plan_cells(study, preset):  # cheapest first
        first_cell.setdefault(cell.size, cell)
    rates = {}
    for size, cell in first_cell.items():
        for steps in (WARMUP_STEPS, MEASURED_STEPS):
            with TemporaryDirectory(prefix="k3scale-rate-") as out_dir:
                cfg = trial_config(
                    study, preset, cell, lr=preset_lr(preset), batch_size=preset_batch(preset),
                    seed=preset.seeds[0], out_dir=out_dir, data_root=data_root,
                    tracking_uri=None, dataset=dataset, tags={},
                )  # fmt: skip
                result = train(cfg, resume=False, stop_after_steps=steps)
        rates[size] = result.tokens_per_s
        progress(f"  {size}: {rates[size]:,.0f} tokens/s over {result.steps} steps")
    return rates
