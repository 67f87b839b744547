"""Study progress read from the Optuna storage (no driver needed)."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from k3scale.sweep.declaration import Study, StudyPreset
from k3scale.sweep.planner import plan_cells
from k3scale.sweep.sources import open_storage, study_names


def study_status(study: Study, preset: StudyPreset, storage_url: str) -> str:
    """One line per cell, each arm's cells together (arch, then schedule, in ladder order):
    completed, failed and running trials, and the best objective with its LR and batch."""
    storage = open_storage(storage_url)
    existing = study_names(storage_url)
    lines = [f"{'cell':40s} {'done':>5s} {'fail':>5s} {'run':>4s}  best  (at peak lr, batch)"]
    totals = [0, 0, 0]
    # sorted() is stable: within an arm the planner's ladder and budget order stays.
    for cell in sorted(plan_cells(study, preset), key=lambda c: (c.arch, c.schedule)):
        if cell.key not in existing:
            lines.append(f"{cell.key:40s} {'-':>5s} {'-':>5s} {'-':>4s}  (not started)")
            continue
        trials = optuna.load_study(study_name=cell.key, storage=storage).get_trials(deepcopy=False)
        done = [t for t in trials if t.state == TrialState.COMPLETE]
        failed = sum(t.state == TrialState.FAIL for t in trials)
        running = sum(t.state == TrialState.RUNNING for t in trials)
        best = min(done, key=lambda t: (t.value, t.number), default=None)
        totals = [totals[0] + len(done), totals[1] + failed, totals[2] + running]
        lines.append(f"{cell.key:40s} {len(done):5d} {failed:5d} {running:4d}  {_best_text(best)}")
    lines.append(f"{'total':40s} {totals[0]:5d} {totals[1]:5d} {totals[2]:4d}")
    return "\n".join(lines)


def _best_text(best: optuna.trial.FrozenTrial | None) -> str:
    if best is None:
        return "-"
    lr, batch = best.params.get("lr"), best.params.get("batch_size")
    where = f"  (lr {lr:.3g}, batch {batch})" if lr is not None else ""
    return f"{best.value:.4f}{where}"
