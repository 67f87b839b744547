"""Seed effects in the run noise (methods.md 4.8, 4.9).

A seed fixes the initial weights and the data order, so runs that share a seed share part of
their error. The model, per run:

    loss = f_cell(lr, batch) + u_seed + w_cell,seed + e

- u_seed: shared by every run of that seed in the study (the data order is the seed's);
- w_cell,seed: shared by the runs of one seed within one cell. Cells of one slot (arch, size,
  budget: a WSD and a cosine cell of one model, with the same init and data) share part of it
  (`slot_share`); budgets do not (the within-cell residuals of one size's two budgets correlate
  0.07 and -0.10 in the cpu_v2 studies; cosine_vs_wsd's schedules of one slot 0.28);
- e: per run, what the quadratic's residuals measure (`optimum.pooled_noise`).

A cell's tuning trials all share one seed, so its fitted curve carries that seed's u + w whole.
The estimator levels the curve at the point where the cell re-ran other seeds: the cell's loss
there is the mean over its seeds (the tuned seed's value read off the quadratic, not its
selected trial), and the curve is shifted to it. The error left is the mean of the seeds'
u + w, drawn here: u once per seed for the whole study (so arms on the same seeds share it and
paired differences cancel it), w once per slot and seed (its shared part) and per cell.

The components come from the cells' seed levels by moments: an additive cell + seed fit gives
the within-cell variance (w + e of one run, `cell_sd`) from its residuals and the seed variance
(`shared_sd`) from the spread of its seed effects beyond what the residuals put there.
"""

from __future__ import annotations

import dataclasses

import numpy as np

# Seeds needed to estimate the study-wide seed variance (its degrees of freedom: seeds - 1).
MIN_SEEDS = 2
# A slot's shared part is used only where its covariance exceeds this many standard errors.
SHARE_Z = 1.645


@dataclasses.dataclass(frozen=True)
class SeedLevel:
    """One cell's runs at its levelling point: the tuned seed's fitted value, then re-runs.

    Attributes:
        slot: (arch, size, budget_tokens): cells of one slot and seed share init and data.
        seeds: the seeds at the point; the first is the tuning trials' seed.
        losses: the tuned seed's quadratic value at the point, then each re-run's final loss.
    """

    slot: tuple
    seeds: tuple[int, ...]
    losses: tuple[float, ...]
    tuned_leverage: float = 1.0
    """Variance of the tuned seed's fitted value over e's (x'(X'X)^-1 x of its quadratic)."""


@dataclasses.dataclass(frozen=True)
class SeedComponents:
    """The seed components of the run noise, each sd with its degrees of freedom."""

    shared_sd: float
    """u: sd of a seed's study-wide effect."""
    shared_df: int
    cell_sd: float
    """w + e: sd of one re-run's seed effect within its cell, beyond u."""
    cell_df: int
    slot_share: float
    """Share of the within-cell variance common to the cells of one slot (0 where none pair)."""
    seed_means: dict[int, float]
    """Each seed's estimated study-wide effect (nats, summing to 0 over the seeds)."""
    within_seed_sd: float = 0.0
    """e, part of `cell_sd`: the tuned seed's level is read off its quadratic, whose draws
    carry its e already, so its within-cell term draws w alone."""
    within_seed_df: int = 0

    def to_dict(self) -> dict:
        return {
            "shared_sd": self.shared_sd,
            "shared_df": self.shared_df,
            "cell_sd": self.cell_sd,
            "cell_df": self.cell_df,
            "slot_share": self.slot_share,
            "seed_effects": {str(k): v for k, v in sorted(self.seed_means.items())},
            "within_seed_sd": self.within_seed_sd,
            "within_seed_df": self.within_seed_df,
        }


def estimate_components(
    levels: list[SeedLevel], within_seed_sd: float = 0.0, within_seed_df: int = 0
) -> SeedComponents | None:
    """The components from cells with at least two seeds at their point, or None (too few).

    within_seed_sd: e, measured by the quadratics' residuals. A tuned seed's level is read off
    its quadratic, so it carries only `tuned_leverage` of e's variance where a re-run carries
    all of it: the residuals' expected square, sum_i (1 - H_ii) var_i, is solved for w with e
    known, and `cell_sd` is then a re-run's w + e. Where the re-runs show no w beyond e, they
    measure e as well, and e is pooled from both (`within_seed_df` residual degrees of freedom
    and the fit's).
    """
    levels = [lv for lv in levels if len(lv.seeds) >= 2]
    seeds = sorted({s for lv in levels for s in lv.seeds})
    if len(seeds) < MIN_SEEDS:
        return None
    fit = _additive_fit(levels, seeds)
    if fit is None:
        return None
    e_var = within_seed_sd**2
    e_weight = sum(
        float(np.sum(free * [lv.tuned_leverage, *[1.0] * (len(lv.seeds) - 1)]))
        for lv, free in zip(levels, fit.free_share, strict=True)
    )
    rss = float(sum(np.sum(r**2) for r in fit.residuals))
    w_var = (rss - e_var * e_weight) / fit.df
    e_df = within_seed_df
    if w_var <= 0 and within_seed_df:
        e_var = (e_var * within_seed_df + rss) / (within_seed_df + e_weight)
        e_df = within_seed_df + fit.df
    w_var = max(w_var, 0.0)
    cell_var = w_var + e_var
    counts = np.array([sum(s in lv.seeds for lv in levels) for s in seeds], dtype=float)
    # A seed effect estimated from n_k cells carries about cell_var / n_k of residual noise.
    spread = float(np.sum(fit.seed_effects**2) / (len(seeds) - 1))
    shared_var = max(spread - cell_var * float(np.mean(1.0 / counts)), 0.0)
    return SeedComponents(
        shared_sd=float(np.sqrt(shared_var)),
        shared_df=len(seeds) - 1,
        cell_sd=float(np.sqrt(cell_var)),
        cell_df=fit.df,
        slot_share=_slot_share(levels, fit.residuals, cell_var),
        seed_means={s: float(v) for s, v in zip(seeds, fit.seed_effects, strict=True)},
        within_seed_sd=float(np.sqrt(e_var)),
        within_seed_df=e_df,
    )


@dataclasses.dataclass(frozen=True)
class _AdditiveFit:
    seed_effects: np.ndarray
    """One per seed, summing to 0."""
    residuals: list[np.ndarray]
    """Per level, its entries' residuals."""
    free_share: list[np.ndarray]
    """Per level, 1 - H_ii of its entries: the share of an entry's variance its residual keeps."""
    df: int


def _additive_fit(levels: list[SeedLevel], seeds: list[int]) -> _AdditiveFit | None:
    """Least squares of loss = cell mean + seed effect (effects summing to 0); None without
    residual degrees of freedom."""
    column = {s: i for i, s in enumerate(seeds)}
    rows, y = [], []
    for c, lv in enumerate(levels):
        for s, loss in zip(lv.seeds, lv.losses, strict=True):
            row = np.zeros(len(levels) + len(seeds) - 1)
            row[c] = 1.0
            k = column[s]
            if k < len(seeds) - 1:
                row[len(levels) + k] = 1.0
            else:
                row[len(levels) :] = -1.0  # the last effect is minus the sum of the others
            rows.append(row)
            y.append(loss)
    x, y = np.array(rows), np.array(y)
    df = len(y) - np.linalg.matrix_rank(x)
    if df < 1:
        return None
    pinv = np.linalg.pinv(x)
    coef = pinv @ y
    hat = np.einsum("ij,ji->i", x, pinv)
    free = coef[len(levels) :]
    fitted = x @ coef
    residuals, shares, start = [], [], 0
    for lv in levels:
        stop = start + len(lv.seeds)
        residuals.append(y[start:stop] - fitted[start:stop])
        shares.append(1.0 - hat[start:stop])
        start = stop
    return _AdditiveFit(np.append(free, -free.sum()), residuals, shares, int(df))


def _slot_share(levels: list[SeedLevel], residuals: list[np.ndarray], cell_var: float) -> float:
    """Covariance of residuals of one seed in two cells of one slot, over cell_var, in [0, 1];
    0 unless the covariance is significantly positive."""
    by_slot: dict[tuple, list[int]] = {}
    for i, lv in enumerate(levels):
        by_slot.setdefault(lv.slot, []).append(i)
    products = []
    for members in by_slot.values():
        for a_pos, a in enumerate(members):
            for b in members[a_pos + 1 :]:
                for k, seed in enumerate(levels[a].seeds):
                    if seed in levels[b].seeds:
                        products.append(residuals[a][k] * residuals[b][levels[b].seeds.index(seed)])
    if len(products) < 2 or cell_var <= 0:
        return 0.0
    mean = float(np.mean(products))
    # Only a covariance that stands out from its noise pairs the cells: a share read into
    # noise would narrow every paired interval (one-sided, 5%).
    if mean <= SHARE_Z * float(np.std(products, ddof=1)) / np.sqrt(len(products)):
        return 0.0
    return float(np.clip(mean / cell_var, 0.0, 1.0))


def level_error_draws(
    components: SeedComponents,
    levels: list[SeedLevel | None],
    num_draws: int,
    rng: np.random.Generator,
) -> list[np.ndarray | None]:
    """Per cell, [num_draws] draws of the mean seed effect over its seeds at its point.

    Each sd is drawn with its own uncertainty (a scaled inverse chi-square on its degrees of
    freedom). u is drawn once per seed for every cell, w's slot part once per slot and seed, so
    cells that share seeds (and slots) get correlated draws, as their runs are.
    """
    shared_scale = _sd_draws(components.shared_sd, components.shared_df, num_draws, rng)
    cell_scale = _sd_draws(components.cell_sd, components.cell_df, num_draws, rng)
    seeds = sorted({s for lv in levels if lv for s in lv.seeds})
    shared = {s: shared_scale * rng.standard_normal(num_draws) for s in seeds}
    slot_part: dict[tuple, np.ndarray] = {}
    share = components.slot_share
    # The tuned seed (first of a level) draws w alone: its e is in the quadratic's draws.
    e_share = (components.within_seed_sd / components.cell_sd) ** 2 if components.cell_sd else 0.0
    tuned_share = np.sqrt(max(1.0 - e_share, 0.0))
    out: list[np.ndarray | None] = []
    for lv in levels:
        if lv is None:
            out.append(None)
            continue
        total = np.zeros(num_draws)
        for k, s in enumerate(lv.seeds):
            if (lv.slot, s) not in slot_part:
                slot_part[(lv.slot, s)] = rng.standard_normal(num_draws)
            own = rng.standard_normal(num_draws)
            w = np.sqrt(share) * slot_part[(lv.slot, s)] + np.sqrt(1 - share) * own
            total += shared[s] + cell_scale * w * (tuned_share if k == 0 else 1.0)
        out.append(total / len(lv.seeds))
    return out


def new_seed_draws(
    components: SeedComponents, num_draws: int, rng: np.random.Generator
) -> np.ndarray:
    """[num_draws] draws of a new seed's effect (u + w + e) at one point."""
    shared = _sd_draws(components.shared_sd, components.shared_df, num_draws, rng)
    cell = _sd_draws(components.cell_sd, components.cell_df, num_draws, rng)
    return shared * rng.standard_normal(num_draws) + cell * rng.standard_normal(num_draws)


def _sd_draws(sd: float, df: int, num_draws: int, rng: np.random.Generator) -> np.ndarray:
    return sd * np.sqrt(df / rng.chisquare(df, size=num_draws))
