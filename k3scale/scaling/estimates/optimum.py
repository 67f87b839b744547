"""A cell's tuned optimum as a fitted quantity with a sound interval (methods.md 4.2, 4.7).

The loss of a (size, budget, schedule) cell at its tuned hyper-parameters is estimated as the
minimum, over the searched box, of a least-squares quadratic through the cell's trials:

- "2d": `L = q(u, v)` full quadratic in u = log lr and v = log batch (>= 3 batch sizes, >= 7
  trials);
- "1d+batch": `L = c_batch + b u + a u^2` (batch shifts the loss, the LR curve's shape is shared;
  >= 2 batch sizes);
- "1d": `L = c + b u + a u^2` (one batch size).

Each needs at least one trial more than it has coefficients and 3 distinct learning rates.

Its interval comes from the sampling distribution of that estimator, not from resampling trials
and taking a minimum (inconsistent: a resample's minimum cannot go below the sample's). For a
linear least-squares fit with Gaussian run noise of sd sigma the coefficients are exactly
N(coef, sigma^2 (X'X)^-1); the noise comes from the study (`pooled_noise`) and its own
uncertainty enters as a scaled inverse chi-square draw. Each draw's minimum over the box is a
draw of the optimum loss (a parametric bootstrap without the refits). The trials share one
seed, whose effect the curve carries whole: where the study re-ran seeds, the curve is levelled
to the mean of the cell's seeds at the best trial's point (`Level`), and the draws add the
seeds' effects (`seed_effects`). A cell whose fitted minimum sits on an edge of the searched box, or whose trials
cannot support a quadratic, is flagged `not identified` with the reason.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.stats import f as f_dist

from k3scale.scaling.estimates.seed_effects import SeedComponents
from k3scale.scaling.values.uncertainty import LEVEL, percentile_interval
from k3scale.scaling.values.verdict import Verdict

LR_GRID = 121
BATCH_GRID = 41
MIN_TRIALS_1D = 4
MIN_TRIALS_2D = 7


@dataclasses.dataclass(frozen=True)
class CellQuadratic:
    """A least-squares quadratic through one cell's trials, and the box it may be read in.

    Attributes:
        mode: "2d" | "1d+batch" | "1d".
        coef: [p] coefficients.
        xtx_inv: [p, p] (X'X)^-1, the coefficients' covariance over sigma^2.
        rss, df: residual sum of squares and its degrees of freedom (n - p).
        u_range, v_range: searched log lr and log batch ranges (the trials' extremes).
        levels: log batch sizes of "1d+batch" (its intercepts, in order).
    """

    mode: str
    coef: np.ndarray
    xtx_inv: np.ndarray
    rss: float
    df: int
    u_range: tuple[float, float]
    v_range: tuple[float, float]
    levels: tuple[float, ...] = ()

    def features(self, u: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Design rows [m, p] at log lr u [m] and log batch v [m]; NaN rows off the levels."""
        u, v = np.broadcast_arrays(np.asarray(u, float), np.asarray(v, float))
        if self.mode == "2d":
            return np.column_stack([np.ones_like(u), u, v, u * u, u * v, v * v])
        if self.mode == "1d":
            return np.column_stack([np.ones_like(u), u, u * u])
        onehot = np.column_stack([np.isclose(v, lv) for lv in self.levels]).astype(float)
        onehot[~onehot.any(axis=1)] = np.nan
        return np.column_stack([onehot, u, u * u])

    def box(self) -> tuple[np.ndarray, np.ndarray]:
        """(u [m], v [m]) grid over the searched box where the minimum is taken."""
        u = np.linspace(*self.u_range, LR_GRID)
        if self.mode == "1d":
            return u, np.full_like(u, self.v_range[0])
        v = np.linspace(*self.v_range, BATCH_GRID) if self.mode == "2d" else np.array(self.levels)
        uu, vv = np.meshgrid(u, v, indexing="ij")
        return uu.ravel(), vv.ravel()


def quadratic_mode(lr: np.ndarray, batch: np.ndarray) -> tuple[str | None, str]:
    """Which quadratic the trials support, or None and why not."""
    n, n_lr, n_batch = len(lr), len(np.unique(lr)), len(np.unique(batch))
    if n_lr < 3:
        return None, f"{n_lr} distinct learning rates (a quadratic needs >= 3)"
    if n_batch == 1:
        if n < MIN_TRIALS_1D:
            return None, f"{n} trials at one batch size (needs >= {MIN_TRIALS_1D})"
        return "1d", ""
    if n_batch >= 3 and n >= MIN_TRIALS_2D:
        return "2d", ""
    if n >= n_batch + 3:
        return "1d+batch", ""
    return None, (
        f"{n} trials over {n_batch} batch sizes: too few for a quadratic in (log lr, log batch) "
        f"(needs >= {MIN_TRIALS_2D} at >= 3 batch sizes, or >= {n_batch + 3} for one LR curve "
        "shared by the batch sizes)"
    )


def fit_quadratic(lr, batch, loss) -> tuple[CellQuadratic | None, str]:
    """Least-squares quadratic of one cell's trials, or (None, reason)."""
    lr, batch, loss = (np.asarray(a, dtype=np.float64) for a in (lr, batch, loss))
    mode, reason = quadratic_mode(lr, batch)
    if mode is None:
        return None, reason
    u, v = np.log(lr), np.log(batch)
    levels = tuple(np.unique(v)) if mode == "1d+batch" else ()
    shell = CellQuadratic(
        mode, np.zeros(0), np.zeros((0, 0)), 0.0, 0, (u.min(), u.max()), (v.min(), v.max()), levels
    )
    x = shell.features(u, v)
    xtx = x.T @ x
    if np.linalg.matrix_rank(xtx) < x.shape[1]:
        return None, f"trials do not span the {mode} quadratic (rank-deficient design)"
    xtx_inv = np.linalg.inv(xtx)
    if _covariance_factor(xtx_inv) is None:
        # Full rank, yet so near-collinear (LRs that nearly follow the batch sizes) that
        # rounding leaves the coefficients' covariance indefinite: no draws can be made.
        return None, f"trials barely span the {mode} quadratic (ill-conditioned design)"
    coef = xtx_inv @ x.T @ loss
    rss = float(np.sum((loss - x @ coef) ** 2))
    return dataclasses.replace(
        shell, coef=coef, xtx_inv=xtx_inv, rss=rss, df=len(loss) - x.shape[1]
    ), ""


@dataclasses.dataclass(frozen=True)
class Noise:
    """Run-to-run noise sd pooled over a study, with its degrees of freedom and sources."""

    sd: float | None
    df: int
    parts: dict
    seeds: SeedComponents | None = None
    """The seed components of the noise (None: no re-runs measured them)."""

    def to_dict(self) -> dict:
        seeds = self.seeds.to_dict() if self.seeds else None
        return {"sd": self.sd, "df": self.df, **self.parts, "seed_effects": seeds}


def pooled_noise(
    quadratics: list[CellQuadratic], seed_groups: list[list[float]], seeds_modelled: bool = False
) -> Noise:
    """The run noise the quadratics' coefficient draws use.

    seed_groups: per cell, the losses of runs at one point (its seed re-runs; when a cell has
    a single re-run, [best trial, re-run], whose difference holds two runs' noise).
    seeds_modelled: the seed effects are drawn apart (`seed_effects`): the re-runs' scatter is
    then the seeds' (u + w + e), not the within-seed noise e of the quadratic's trials, and the
    residuals alone measure e (the re-runs stand in only where no residual is free).
    """
    ss_fit = sum(q.rss for q in quadratics)
    df_fit = sum(q.df for q in quadratics)
    pairs = [g[1] - g[0] for g in seed_groups if len(g) == 2]
    groups = [g for g in seed_groups if len(g) > 2]
    ss_seed = sum(float(np.sum((np.array(g) - np.mean(g)) ** 2)) for g in groups)
    df_seed = sum(len(g) - 1 for g in groups)
    if len(pairs) >= 2:
        # Differences hold two runs' noise; their mean (the best trial's selection) is removed.
        ss_seed += float(np.sum((np.array(pairs) - np.mean(pairs)) ** 2)) / 2
        df_seed += len(pairs) - 1
    parts = {
        "quadratic_residual_sd": float(np.sqrt(ss_fit / df_fit)) if df_fit else None,
        "quadratic_df": df_fit,
        "seed_sd": float(np.sqrt(ss_seed / df_seed)) if df_seed else None,
        "seed_df": df_seed,
    }
    if seeds_modelled and df_fit:
        parts["method"] = "within-seed noise from the quadratics' residuals; seed effects apart"
        return Noise(sd=parts["quadratic_residual_sd"], df=df_fit, parts=parts)
    lack = _lack_of_fit_p(ss_fit, df_fit, ss_seed, df_seed)
    parts["lack_of_fit_p"] = lack
    if lack is not None and lack < LACK_OF_FIT_LEVEL:
        # The quadratics miss the trials by more than run noise: their residual scatter is the
        # honest size of an error, not the seeds' (wider intervals, never narrower).
        parts["method"] = "quadratic residuals alone (lack of fit against the seed re-runs)"
        return Noise(sd=parts["quadratic_residual_sd"], df=df_fit, parts=parts)
    parts["method"] = "one variance pooled from the cells' quadratic residuals and seed re-runs"
    df = df_fit + df_seed
    sd = float(np.sqrt((ss_fit + ss_seed) / df)) if df else None
    return Noise(sd=sd, df=df, parts=parts)


# A quadratic whose residuals exceed the seed noise at this level is said to lack fit.
LACK_OF_FIT_LEVEL = 0.01


def _lack_of_fit_p(ss_fit: float, df_fit: int, ss_seed: float, df_seed: int) -> float | None:
    """P-value of residual variance > seed variance (F-test), when both are measured."""
    if not df_fit or not df_seed or ss_seed <= 0:
        return None
    statistic = (ss_fit / df_fit) / (ss_seed / df_seed)
    return float(f_dist.sf(statistic, df_fit, df_seed))


def coefficient_draws(
    quad: CellQuadratic, noise: Noise, num_draws: int, rng: np.random.Generator
) -> np.ndarray:
    """[num_draws, p] draws of the coefficients: N(coef, s^2 (X'X)^-1), s^2 ~ sd^2 df / chi2_df."""
    scale = noise.sd * np.sqrt(noise.df / rng.chisquare(noise.df, size=num_draws))
    chol = _covariance_factor(quad.xtx_inv)
    z = rng.standard_normal((num_draws, len(quad.coef)))
    return quad.coef + scale[:, None] * (z @ chol.T)


def _covariance_factor(xtx_inv: np.ndarray) -> np.ndarray | None:
    """Cholesky factor of (X'X)^-1 as the draws use it, or None where it is not numerically
    positive definite."""
    try:
        return np.linalg.cholesky(xtx_inv + 1e-15 * np.eye(len(xtx_inv)))
    except np.linalg.LinAlgError:
        return None


def box_minimum(quad: CellQuadratic, coefs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(minimum [k], index into quad.box() [k]) of each coefficient row [k, p]."""
    grid = quad.features(*quad.box())
    values = coefs @ grid.T
    index = np.argmin(values, axis=1)
    return values[np.arange(len(index)), index], index


def edge_reason(quad: CellQuadratic, index: int) -> str | None:
    """Why a fitted minimum at box position `index` is not an interior optimum."""
    u, v = quad.box()
    if np.isclose(u[index], quad.u_range[0]) or np.isclose(u[index], quad.u_range[1]):
        side = "lowest" if np.isclose(u[index], quad.u_range[0]) else "highest"
        return f"fitted optimum at the {side} learning rate searched"
    on_edge = np.isclose(v[index], quad.v_range[0]) or np.isclose(v[index], quad.v_range[1])
    if quad.mode != "1d" and len(np.unique(v)) > 1 and on_edge:
        side = "smallest" if np.isclose(v[index], quad.v_range[0]) else "largest"
        return f"fitted optimum at the {side} batch searched"
    return None


@dataclasses.dataclass(frozen=True)
class BestTrial:
    """The cell's lowest-loss trial: reported when no quadratic can be read."""

    lr: float
    batch: float
    loss: float


@dataclasses.dataclass(frozen=True)
class CellOptimum:
    """One cell's optimum: point estimate, verdict, and draws of its sampling distribution."""

    quad: CellQuadratic | None
    loss: float
    lr: float
    batch: float
    verdict: Verdict
    draws: np.ndarray | None
    coef_draws: np.ndarray | None = None
    """[S, p] coefficient draws behind `draws` (None without a quadratic)."""
    draw_index: np.ndarray | None = None
    """[S] each draw's minimum as an index into quad.box()."""
    shift: float = 0.0
    """What levels the tuned seed's quadratic to the mean of the cell's seeds (`level_shift`):
    the fitted curve plus `shift` is the cell's loss; `loss` includes it."""
    shift_draws: np.ndarray | None = None
    """[S] draws of `shift` with the seeds' effects (None: the seed-0 curve, unlevelled)."""

    def levelled(self, fitted: np.ndarray) -> np.ndarray:
        """Draws [S] of the quadratic's values `fitted` [S] moved to the seeds' mean."""
        return fitted + (self.shift if self.shift_draws is None else self.shift_draws)

    @property
    def identified(self) -> bool:
        return self.verdict.identified

    def interval(self, level: float = LEVEL) -> list[float] | None:
        if self.draws is None:
            return None
        return percentile_interval(self.draws, level, min_draws=1)


@dataclasses.dataclass(frozen=True)
class Level:
    """Where a cell's seeds meet: the point, the re-runs' losses there, and draws of the mean
    seed effect over the cell's seeds (`seed_effects.level_error_draws`; None: not modelled)."""

    lr: float
    batch: float
    reruns: tuple[float, ...]
    seed_error_draws: np.ndarray | None


def level_shift(quad: CellQuadratic, level: Level, coefs: np.ndarray) -> np.ndarray:
    """[k] shift per coefficient row [k, p]: the mean over the cell's seeds at the level point
    (the quadratic's own value there for the tuned seed, then each re-run) minus that value."""
    row = quad.features(np.array([np.log(level.lr)]), np.array([np.log(level.batch)]))
    at_point = coefs @ row[0]
    seeds = 1 + len(level.reruns)
    return (at_point + sum(level.reruns)) / seeds - at_point


def estimate_optimum(
    quad: CellQuadratic | None,
    reason: str,
    best: BestTrial,
    noise: Noise,
    num_draws: int,
    rng: np.random.Generator,
    level: Level | None = None,
) -> CellOptimum:
    """The cell's optimum from its quadratic; the best trial (not identified) when there is none.

    With a `level`, the quadratic (fitted to one seed's trials) is shifted to the mean of the
    cell's seeds at the level point, and the draws carry the seeds' effects.
    """
    if quad is None:
        return CellOptimum(None, best.loss, best.lr, best.batch, Verdict(reason), None)
    value, index = box_minimum(quad, quad.coef[None])
    u, v = quad.box()
    why = edge_reason(quad, int(index[0]))
    if noise.sd is None:
        why = why or "no run noise measured (no residual or seed degrees of freedom)"
    shift = float(level_shift(quad, level, quad.coef[None])[0]) if level else 0.0
    draws = coefs = draw_index = shift_draws = None
    if noise.sd is not None and num_draws > 0:
        coefs = coefficient_draws(quad, noise, num_draws, rng)
        draws, draw_index = box_minimum(quad, coefs)
        if level is not None:
            errors = level.seed_error_draws
            shift_draws = level_shift(quad, level, coefs) + (0.0 if errors is None else errors)
            draws = draws + shift_draws
    return CellOptimum(
        quad,
        float(value[0]) + shift,
        float(np.exp(u[index[0]])),
        float(np.exp(v[index[0]])),
        Verdict.first(why),
        draws,
        coefs,
        draw_index,
        shift,
        shift_draws,
    )
