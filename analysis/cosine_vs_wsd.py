"""Recipe: cosine vs WSD, each with its own tuned (peak LR, batch) and a fixed lr_min.

What the report needs (methods.md 3.4, 4.7): per cell, each schedule's fitted optimum and the
difference at own optima and at the shared (cosine-tuned) setting, with intervals from the
optima's sampling distribution and a verdict; the pooled difference over cells with its sign
count; compute-optimal frontiers per schedule (surface and envelope routes) and the cosine-over-
WSD compute multiplier under both FLOP conventions; per-schedule HP laws.
"""

from __future__ import annotations

from k3scale.scaling import study

REFERENCE = "cosine"
BASELINE_FOR_MULTIPLIER = "wsd"


def run(runs, curves, options: study.StudyOptions) -> dict:
    """Every fit and comparison of the cosine-vs-WSD report, from the run table."""
    usable, excluded = study.usable_runs(runs, options)
    estimates, noise = study.cell_estimates(usable, options)
    records = study.cell_records(estimates)
    by_schedule = {}
    for schedule in sorted({r.cell["schedule"] for r in records}):
        mine = [r for r in records if r.cell["schedule"] == schedule]
        by_schedule[schedule] = {
            "hp_laws": {c: study.hp_laws(mine, c, options) for c in options.computes},
        }
    return {
        "excluded": excluded,
        "cell_optima": [r.to_json() for r in records],
        "run_noise": noise.to_dict(),
        "rerun_check": study.rerun_coverage(estimates, noise, options),
        "schedule_comparison": study.schedule_comparison(estimates, noise, REFERENCE, options),
        "compute_optimal": study.compute_optimal_comparison(
            estimates, "schedule", BASELINE_FOR_MULTIPLIER, options
        ),
        "per_schedule": by_schedule,
    }
