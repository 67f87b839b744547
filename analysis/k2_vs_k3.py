"""Recipe: K3-style vs K2-style compute multiplier at matched compute (the K3 report's ~2.5x).

What the report needs (methods.md 2.6, 2.8): per-cell fitted optima per architecture with
verdicts; each architecture's compute-optimal frontier by two routes (Approach 3 surface, and the
model-free envelope) and M(C) from each, inside the compute range both cover, with intervals from
the optima's sampling distribution and a verdict; the two routes' agreement; the parametric
frontier through the Pareto optima with the shared-exponent F-test; all under 6*N_active*D and
the attention-inclusive FLOP count. Plus per-arch Chinchilla surfaces
and IsoFLOP exponents where the design supports them, and a largest-budget backtest.
"""

from __future__ import annotations

from k3scale.scaling import study

BASELINE = "k2"


def run(runs, curves, options: study.StudyOptions) -> dict:
    """Every fit and comparison of the K2-vs-K3 report, from the run table."""
    usable, excluded = study.usable_runs(runs, options)
    estimates, _noise = study.cell_estimates(usable, options)
    optima = study.cell_optima_json(estimates, options)
    per_arch = {}
    for arch in sorted({o["cell"]["arch"] for o in optima}):
        mine = [o for o in optima if o["cell"]["arch"] == arch]
        per_arch[arch] = {
            "surface": study.surface(mine, arch, options),
            "isoflop": {c: study.isoflop(mine, c, options) for c in options.computes},
            "backtest": {c: study.backtest(mine, c) for c in options.computes},
        }
    return {
        "excluded": excluded,
        "cell_optima": optima,
        "compute_optimal": study.compute_optimal_comparison(estimates, "arch", BASELINE, options),
        "frontiers": study.frontiers(optima, "arch", BASELINE, options),
        "per_arch": per_arch,
    }
