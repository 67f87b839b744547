"""Recipe: cosine vs WSD, each with its own tuned (peak LR, batch) and a fixed lr_min.

What the report needs (methods.md 3.4): per cell, each schedule's loss at its own tuned optimum
and at the shared (cosine-tuned) setting, the difference with an interval and the sign the data
support; the tuned optima and their ratios; per-schedule frontiers and the WSD -> cosine compute
multiplier under both FLOP conventions; per-schedule HP laws; a backtest of each frontier.
"""

from __future__ import annotations

from k3scale.scaling import study

REFERENCE = "cosine"
BASELINE_FOR_MULTIPLIER = "wsd"


def run(runs, curves, options: study.StudyOptions) -> dict:
    """Every fit and comparison of the cosine-vs-WSD report, from the run table."""
    usable, excluded = study.usable_runs(runs, options)
    optima = study.cell_optima(usable, options)
    by_schedule = {}
    for schedule in sorted({o["cell"]["schedule"] for o in optima}):
        mine = [o for o in optima if o["cell"]["schedule"] == schedule]
        by_schedule[schedule] = {
            "hp_laws": {c: study.hp_laws(mine, c, options) for c in options.computes},
            "backtest": {c: study.backtest(mine, c) for c in options.computes},
        }
    return {
        "excluded": excluded,
        "cell_optima": optima,
        "schedule_comparison": study.schedule_comparison(usable, REFERENCE, options),
        "frontiers": study.frontiers(optima, "schedule", BASELINE_FOR_MULTIPLIER, options),
        "per_schedule": by_schedule,
    }
