"""Study progress read from the Optuna storage (no driver needed)."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from k3scale.sweep.declaration import Study, StudyPreset
from k3scale.sweep.planner import plan_cells
from k3scale.sweep.sources import extra_name, open_storage, study_names


def study_status(study: Study, preset: StudyPreset, storage_url: str) -> str:
    """One line per cell, each arm's cells together (arch, then schedule, in ladder order):
    completed, failed and running tuning trials, completed extra runs (the best point's re-runs
    on other seeds), and the best objective with its LR and batch. The totals count every trial,
    so they add up to what the study's record calls finished."""
    storage = open_storage(storage_url)
    existing = study_names(storage_url)
    lines = [
        f"{'cell':40s} {'done':>5s} {'fail':>5s} {'run':>4s} {'extra':>5s}  best  "
        "(at peak lr, batch)"
    ]
    totals = [0, 0, 0, 0]
    # sorted() is stable: within an arm the planner's ladder and budget order stays.
    for cell in sorted(plan_cells(study, preset), key=lambda c: (c.arch, c.schedule)):
        if cell.key not in existing:
            lines.append(f"{cell.key:40s} {'-':>5s} {'-':>5s} {'-':>4s} {'-':>5s}  (not started)")
            continue
        trials = _trials(cell.key, storage)
        extra = _trials(extra_name(cell), storage) if extra_name(cell) in existing else []
        done = [t for t in trials if t.state == TrialState.COMPLETE]
        counts = [
            len(done),
            sum(t.state == TrialState.FAIL for t in trials + extra),
            sum(t.state == TrialState.RUNNING for t in trials + extra),
            sum(t.state == TrialState.COMPLETE for t in extra),
        ]
        totals = [a + b for a, b in zip(totals, counts, strict=True)]
        best = min(done, key=lambda t: (t.value, t.number), default=None)
        lines.append(f"{cell.key:40s} {_counts(counts)}  {_best_text(best)}")
    lines.append(f"{'total':40s} {_counts(totals)}  ({totals[0] + totals[3]} finished)")
    return "\n".join(lines)


def _trials(name: str, storage) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)


def _counts(counts: list[int]) -> str:
    done, failed, running, extra = counts
    return f"{done:5d} {failed:5d} {running:4d} {extra:5d}"


def _best_text(best: optuna.trial.FrozenTrial | None) -> str:
    if best is None:
        return "-"
    lr, batch = best.params.get("lr"), best.params.get("batch_size")
    where = f"  (lr {lr:.3g}, batch {batch})" if lr is not None else ""
    return f"{best.value:.4f}{where}"
