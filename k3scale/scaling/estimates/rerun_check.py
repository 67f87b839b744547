"""The intervals checked on real runs they did not use (methods.md 4.9).

Each seed re-run sits at the point its cell's tuned seed picked; the re-run picked nothing. Left
out in turn, it is scored against the predictive interval for its seed at that point: the
cell's level there from its other seeds (the tuned seed's quadratic value and the other
re-runs), plus its seed's study-wide effect as the other cells estimate it and a draw of what
that leaves unknown, with the seed components re-estimated without it. A model
that holds puts the re-runs inside their 95% intervals at about that rate; the hit count gets a
binomial (Clopper-Pearson) interval, and the cells whose re-runs fall outside are named.

The re-runs of one seed share its study-wide effect, so hits are not independent: the binomial
interval is a guide, narrower than the count's real uncertainty.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.stats import beta

from k3scale.scaling.estimates import seed_effects
from k3scale.scaling.values.uncertainty import LEVEL, percentile_interval

NUM_DRAWS = 4000


@dataclasses.dataclass(frozen=True)
class RerunScore:
    """One re-run against the predictive interval for its seed at its point."""

    cell: dict
    seed: int
    loss: float
    predicted: float
    interval: list[float]

    @property
    def hit(self) -> bool:
        return self.interval[0] <= self.loss <= self.interval[1]

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "hit": self.hit}


@dataclasses.dataclass(frozen=True)
class RerunCoverage:
    """How many re-runs their predictive intervals hold, against the nominal rate."""

    nominal: float
    scores: list[RerunScore]
    skipped: str | None = None
    """Why no re-run could be scored (None when some were)."""

    @property
    def hits(self) -> int:
        return sum(s.hit for s in self.scores)

    def rate_interval(self, level: float = LEVEL) -> list[float] | None:
        """Clopper-Pearson interval of the hit rate."""
        n, k = len(self.scores), self.hits
        if not n:
            return None
        tail = (1 - level) / 2
        lo = 0.0 if k == 0 else float(beta.ppf(tail, k, n - k + 1))
        hi = 1.0 if k == n else float(beta.ppf(1 - tail, k + 1, n - k))
        return [lo, hi]

    @property
    def holds(self) -> bool | None:
        """Whether the nominal rate lies in the hit rate's interval (None: nothing scored)."""
        ci = self.rate_interval()
        return None if ci is None else ci[0] <= self.nominal <= ci[1]

    def failing_cells(self) -> list[dict]:
        cells: list[dict] = []
        for s in self.scores:
            if not s.hit and s.cell not in cells:
                cells.append(s.cell)
        return cells

    def to_json(self) -> dict:
        out = {
            "nominal": self.nominal,
            "hits": self.hits,
            "runs": len(self.scores),
            "rate_interval": self.rate_interval(),
            "holds": self.holds,
            "failing_cells": self.failing_cells(),
            "scores": [s.to_json() for s in self.scores],
        }
        return out | ({"skipped": self.skipped} if self.skipped else {})


def check_reruns(
    cells: list[dict],
    levels: list[seed_effects.SeedLevel | None],
    seed: int,
    within_seed_sd: float = 0.0,
    within_seed_df: int = 0,
) -> RerunCoverage:
    """Score every re-run (every seed of a level but the tuned one) of the identified cells.

    cells: where each level's cell sits, recorded on its scores.
    levels: each cell's seeds at its point (None: the cell has no quadratic).
    within_seed_sd, within_seed_df: the run noise e inside one seed, as the study measured it
    (`SeedComponents`).
    """
    scores = []
    for i, (cell, level) in enumerate(zip(cells, levels, strict=True)):
        if level is None:
            continue
        for j in range(1, len(level.seeds)):
            score = _score(cell, levels, i, j, seed, (within_seed_sd, within_seed_df))
            if score is not None:
                scores.append(score)
    skipped = None if scores else "no cell has a seed re-run at a fitted point"
    return RerunCoverage(nominal=LEVEL, scores=scores, skipped=skipped)


def _score(
    cell: dict,
    levels: list[seed_effects.SeedLevel | None],
    i: int,
    j: int,
    seed: int,
    within: tuple[float, int],
) -> RerunScore | None:
    level = levels[i]
    rest = seed_effects.SeedLevel(
        slot=level.slot,
        seeds=level.seeds[:j] + level.seeds[j + 1 :],
        losses=level.losses[:j] + level.losses[j + 1 :],
        tuned_leverage=level.tuned_leverage,
    )
    others = [lv for k, lv in enumerate(levels) if lv is not None and k != i]
    components = seed_effects.estimate_components([*others, rest], *within)
    if components is None:
        return None
    rng = np.random.default_rng([seed, i, j])
    shift, draws = _seed_part(components, [*others, rest], level.seeds[j], rest, rng)
    predicted = float(np.mean(rest.losses)) + shift
    interval = percentile_interval(predicted + draws, LEVEL, min_draws=1)
    return RerunScore(cell, level.seeds[j], level.losses[j], predicted, interval)


def _seed_part(
    components: seed_effects.SeedComponents,
    levels: list[seed_effects.SeedLevel],
    new: int,
    rest: seed_effects.SeedLevel,
    rng: np.random.Generator,
) -> tuple[float, np.ndarray]:
    """(the re-run's seed effect less the cell's other seeds', as the other cells estimate it;
    draws of what that leaves unknown).

    A re-run's seed also ran in the other cells, and its study-wide effect u is estimated there
    (`seed_means`, without this run). Drawn as a new seed's u instead, it widened the intervals
    most where u was largest and the re-runs of a seed agreed: 0.989 of simulated re-runs
    landed inside their 95% intervals (cpu_v3 designs, v2 noise). Given the estimate, what is
    left is the re-run's own w + e, the other seeds' mean w at the point, and the estimate's
    error, about w + e over the number of cells behind each seed effect.
    """
    means = components.seed_means
    if new not in means or any(s not in means for s in rest.seeds):
        quiet = seed_effects.new_seed_draws(components, NUM_DRAWS, rng)
        (level_error,) = seed_effects.level_error_draws(components, [rest], NUM_DRAWS, rng)
        return 0.0, quiet - level_error
    counts = {s: sum(s in lv.seeds for lv in levels) for s in means}
    shift = means[new] - float(np.mean([means[s] for s in rest.seeds]))
    cell_var = components.cell_sd**2
    known = cell_var * (
        1 / counts[new] + float(np.mean([1 / counts[s] for s in rest.seeds])) / len(rest.seeds)
    )
    no_shared = dataclasses.replace(components, shared_sd=0.0)
    (level_error,) = seed_effects.level_error_draws(no_shared, [rest], NUM_DRAWS, rng)
    own = seed_effects.new_seed_draws(no_shared, NUM_DRAWS, rng)
    return shift, own + np.sqrt(known) * rng.standard_normal(NUM_DRAWS) - level_error
