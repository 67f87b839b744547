"""Recipe: K3-style vs K2-style compute multiplier at matched compute (the K3 report's ~2.5x).

What the report needs (methods.md 2.6, 2.8): per-cell fitted optima per architecture with
verdicts; each architecture's compute-optimal frontier by two routes (Approach 3 surface, and the
model-free envelope) and M(C) from each, inside the compute range both cover, with intervals from
the optima's sampling distribution and a verdict; the two routes' agreement; all under
6*N_active*D and the attention-inclusive FLOP count. Plus per-arch IsoFLOP exponents where the
design supports them.
"""

from __future__ import annotations

from k3scale.scaling import study

BASELINE = "k2"


def run(runs, curves, options: study.StudyOptions) -> dict:
    """Every fit and comparison of the K2-vs-K3 report, from the run table."""
    usable, excluded = study.usable_runs(runs, options)
    estimates, noise = study.cell_estimates(usable, options)
    records = study.cell_records(estimates)
    per_arch = {}
    for arch in sorted({r.cell["arch"] for r in records}):
        mine = [r for r in records if r.cell["arch"] == arch]
        per_arch[arch] = {
            "isoflop": {c: study.isoflop(mine, c, options) for c in options.computes},
        }
    return {
        "excluded": excluded,
        "cell_optima": [r.to_json() for r in records],
        "run_noise": noise.to_dict(),
        "rerun_check": study.rerun_coverage(estimates, noise, options),
        "compute_optimal": study.compute_optimal_comparison(estimates, "arch", BASELINE, options),
        "per_arch": per_arch,
    }
