"""Component effects of an ablation study (issue 38): each arm against the full model at matched
design cells, as a loss difference and as an effective-compute multiplier.

Per design cell (rung, budget rank) the arm and the full model each have a fitted optimum whose
draws share each seed's effects (every arm runs on the same seeds), so their difference is
paired (`schedule_compare.compare_cell`, reference = the arm): positive means switching the
component back costs loss, so the component helps.

The multiplier is what the component is worth in compute to the full model: the compute the
arm spent over the compute the full model needs to reach the arm's loss, read off the full
model's frontier law L*(C) = E + K C^-alpha (the envelope route's law through its Pareto cells,
`compute_optimal.envelope_law`) where that law passes its checks, else off its monotone
frontier (issue 47; `full_model_frontier`). At a cell of compute C the arm's loss sits diff above the full
model's, so the full model needs C* with L*(C*) = L*(C) + diff:

    log M = ln C_arm - ln C*

To first order ln C - ln C* = diff / g with g = -dL*/dln C, the frontier's local slope; the law's
exact inverse is used because the frontier bends (noise free on the cpu design the linear
reading overstated 1.16x, 1.25x, 1.4x and 2.5x by 1-6%). C_arm differs from C where a switch
changes the FLOPs per token (a wider MoE, MLA in place of KDA), so no width matching is needed
for the multiplier; the loss difference is at matched rung and tokens. The law's draws come with
the differences' (the same seeds), so the frontier's uncertainty is in the interval. Over cells:
the mean difference (`schedule_compare.pooled`) and the geometric-mean multiplier.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.stats import norm

from k3scale.scaling.estimates.compute_optimal import (
    ArmOptima,
    envelope_law,
    law_record,
    monotone_frontier,
)
from k3scale.scaling.estimates.optimum import CellOptimum
from k3scale.scaling.estimates.schedule_compare import SeedRuns, compare_cell, pooled
from k3scale.scaling.laws.frontier import (
    frontier_grid_log_compute,
    predict_frontier_grid,
    record_lows,
)
from k3scale.scaling.values import verdict
from k3scale.scaling.values.components import CellEffect, ComponentEffect, SumCheck
from k3scale.scaling.values.uncertainty import LEVEL, Estimate, percentile_interval, robust_sd
from k3scale.scaling.values.verdict import Verdict


@dataclasses.dataclass(frozen=True)
class ArmCell:
    """One arm's optimum at one design cell, with where the cell sits and its compute."""

    cell: dict
    compute: float
    optimum: CellOptimum
    reruns: SeedRuns | None = None
    """The re-runs at the chosen point by seed: the selection-free reading (issue 47)."""


@dataclasses.dataclass(frozen=True)
class FullFrontier:
    """The full model's frontier law: point [1, 3] and draws [S, 3] of (E, K', alpha) as
    `fit_frontier_grid` gives them, fitted on the log computes `log_c`."""

    point: np.ndarray
    draws: np.ndarray
    log_c: np.ndarray
    route: str = "envelope"
    refused: str | None = None
    """Why the law was not used (None: it was)."""

    def log_compute_to_reach(
        self, params: np.ndarray, log_c_at: float, diff: np.ndarray
    ) -> np.ndarray:
        """[S] ln C* where the law `params` [S, 3] reaches its own loss at `log_c_at` plus diff."""
        here = predict_frontier_grid(params, self.log_c, np.array([log_c_at]))[:, 0]
        return frontier_grid_log_compute(params, self.log_c, here + diff)

    def reach(self, log_c_at: float, diff: float, diff_draws: np.ndarray):
        """(ln C* at the point, [S] ln C* in every draw)."""
        point = self.log_compute_to_reach(self.point, log_c_at, np.array([diff]))[0]
        return point, self.log_compute_to_reach(self.draws, log_c_at, diff_draws)


# The monotone frontier's grid: fine enough that its inversion's steps are far below any interval.
MONOTONE_GRID = 256


@dataclasses.dataclass(frozen=True)
class MonotoneFrontier:
    """The full model's frontier without a form (`compute_optimal.monotone_frontier`): curves
    [g] and [S, g] on a log-spaced `grid` over its cells' computes. It reads C* only inside
    that range: an arm worse than the full model at its cheapest cell has no C* there."""

    grid: np.ndarray
    point: np.ndarray
    draws: np.ndarray
    refused: str | None = None
    """Why the frontier law was not used."""
    route: str = "monotone"

    @staticmethod
    def _reach(curve: np.ndarray, log_grid: np.ndarray, log_c_at: float, diff) -> float:
        ok = np.isfinite(curve)
        x, y = log_grid[ok], curve[ok]
        keep = record_lows(y)
        x, y = x[keep], y[keep]
        target = np.interp(log_c_at, x, y) + diff
        if len(y) < 2 or not y[-1] <= target <= y[0]:
            return np.nan
        return float(np.interp(-target, -y, x))

    def reach(self, log_c_at: float, diff: float, diff_draws: np.ndarray):
        log_grid = np.log(self.grid)
        point = self._reach(self.point, log_grid, log_c_at, diff)
        draws = np.array(
            [
                self._reach(curve, log_grid, log_c_at, d)
                for curve, d in zip(self.draws, diff_draws, strict=True)
            ]
        )
        return point, draws


def full_model_frontier(full: ArmOptima) -> FullFrontier | MonotoneFrontier:
    """The full model's frontier from its identified optima (point and every draw): its law
    through the Pareto cells where the law passes its checks (`compute_optimal`), else the
    monotone frontier, which assumes no form (issue 47: the cpu study's K3 law sat on its
    exponent grid's end with E = -35.6)."""
    law = law_record(full, None)
    if law.verdict.identified:
        point, log_c = envelope_law(full, full.loss[None])
        draws, _ = envelope_law(full, full.draws)
        return FullFrontier(point, draws, log_c)
    grid = np.exp(np.linspace(*np.log(full.compute_range), MONOTONE_GRID))
    return MonotoneFrontier(
        grid,
        monotone_frontier(full, full.loss[None], grid)[0],
        monotone_frontier(full, full.draws, grid),
        refused=law.verdict.reason,
    )


@dataclasses.dataclass(frozen=True)
class LogMultiplier:
    """log M of one effect: point and draws [S] (NaN where undefined), for pooling and sums."""

    point: float
    draws: np.ndarray


def multiplier_estimate(log_m: LogMultiplier, name: str, reason: str | None) -> Estimate:
    """exp(log M) with its percentile interval and verdict (`reason` first, then the draws'
    defined share and the interval's width, as every multiplier in a fit artifact)."""
    draws = np.exp(log_m.draws)
    share = float(np.isfinite(draws).mean()) if len(draws) else 0.0
    ci = percentile_interval(draws)
    value = float(np.exp(log_m.point)) if np.isfinite(log_m.point) else None
    ruling = Verdict.first(
        reason,
        None if value is not None else f"{name} undefined",
        verdict.defined_share_reason(name, share),
        verdict.ratio_reason(name, ci, verdict.MULTIPLIER_DECADES),
    )
    return Estimate(value, ci, ruling, defined_share=share)


def _log_multiplier(
    frontier: FullFrontier | MonotoneFrontier,
    mine: ArmCell,
    theirs: ArmCell,
    diff: float,
    diff_draws: np.ndarray,
) -> LogMultiplier:
    """ln C_arm - ln C*, at the point and in every draw (NaN where the frontier cannot reach)."""
    point, draws = frontier.reach(float(np.log(theirs.compute)), diff, diff_draws)
    log_c = np.log(mine.compute)
    return LogMultiplier(float(log_c - point), log_c - draws)


def arm_effect(
    arm: str,
    note: str,
    pairs: list[tuple[ArmCell, ArmCell]],
    frontier: FullFrontier | MonotoneFrontier,
    full: str,
) -> tuple[ComponentEffect, LogMultiplier | None]:
    """One arm against the full model over its design cells, and its pooled log multiplier.

    pairs: (the arm's cell, the full model's cell) per design cell both ran.
    """
    cells, comparisons, logs = [], [], []
    for mine, theirs in pairs:
        reruns = (mine.reruns, theirs.reruns) if mine.reruns and theirs.reruns else None
        compared = compare_cell(mine.optimum, theirs.optimum, arm, full, mine.cell, reruns)
        d = compared.difference.own
        reason = d.verdict.reason
        if reason is None and not np.isfinite(frontier.point).any():
            reason = f"{full}'s frontier is not identified (too few cells)"
        log_m = (
            _log_multiplier(frontier, mine, theirs, d.value, compared.own_draws)
            if reason is None
            else LogMultiplier(np.nan, np.empty(0))
        )
        cells.append(CellEffect(compared.difference, multiplier_estimate(log_m, "M", reason)))
        comparisons.append(compared)
        if reason is None:
            logs.append(log_m)
    clusters = [c.cell.get("size", "").rsplit("-", 1)[-1] for c, _ in pairs]
    loss = pooled(comparisons, clusters, arm, full)
    pooled_log = _pooled_log(logs)
    reason = None
    if not logs:
        first = next((c.multiplier.verdict.reason for c in cells), "no cell ran in both")
        reason = f"no cell of {len(pairs)} with an identified difference and law ({first})"
    elif not np.isfinite(pooled_log.point) and frontier.refused:
        unread = sum(not np.isfinite(lm.point) for lm in logs)
        reason = (
            f"{full}'s monotone frontier reads no C* at {unread} of {len(logs)} cells (it "
            f"cannot extrapolate past {full}'s cheapest or dearest cell), and {full}'s frontier "
            f"law is refused ({frontier.refused})"
        )
    multiplier = multiplier_estimate(
        pooled_log or LogMultiplier(np.nan, np.empty(0)), "the multiplier", reason
    )
    return ComponentEffect(arm, note, cells, loss, multiplier), pooled_log


def _pooled_log(logs: list[LogMultiplier]) -> LogMultiplier | None:
    """The mean over cells of log M, draw by draw (paired: draw s of every cell shares seed s)."""
    if not logs:
        return None
    return LogMultiplier(
        float(np.mean([lm.point for lm in logs])), np.mean([lm.draws for lm in logs], axis=0)
    )


def power(multiplier: float, log_draws: np.ndarray, level: float = LEVEL) -> float | None:
    """The chance that a two-sided `level` interval excludes M = 1 when the true multiplier is
    `multiplier`, for an estimate of log M spread as `log_draws` are (normal approximation with
    their `robust_sd` as the standard error; `bench calibrate` checks designs by simulation)."""
    se = robust_sd(log_draws)
    if not se:
        return None
    z = norm.ppf(1 - (1 - level) / 2)
    shift = abs(np.log(multiplier)) / se
    return float(norm.cdf(shift - z) + norm.cdf(-shift - z))


def sum_check(
    against: str, gap: LogMultiplier | None, parts: dict[str, LogMultiplier | None]
) -> SumCheck:
    """The components' product against the whole gap, draw by draw (all share the seeds)."""
    missing = sorted(name for name, lm in parts.items() if lm is None)
    reason = None
    if gap is None:
        reason = f"the gap to {against} has no identified cell"
    elif missing:
        reason = f"no identified multiplier for {', '.join(missing)}"
    if reason:
        empty = Estimate(None, None, Verdict(reason))
        return SumCheck(against, tuple(parts), empty, empty, empty, empty)
    explained = LogMultiplier(
        float(sum(lm.point for lm in parts.values())),
        np.sum([lm.draws for lm in parts.values()], axis=0),
    )
    left = LogMultiplier(gap.point - explained.point, gap.draws - explained.draws)
    gap_estimate = multiplier_estimate(gap, f"M over {against}", None)
    return SumCheck(
        against=against,
        arms=tuple(parts),
        gap=gap_estimate,
        explained=multiplier_estimate(explained, "the product of the components", None),
        left_over=multiplier_estimate(left, "what is left over", None),
        share=_share(explained, gap, gap_estimate),
    )


def _share(explained: LogMultiplier, gap: LogMultiplier, gap_estimate: Estimate) -> Estimate:
    """log explained / log gap with its percentile interval; a share of a gap not shown to
    exist is not identified."""
    ci_gap = gap_estimate.interval
    if not gap_estimate.identified or not ci_gap or ci_gap[0] <= 1 <= ci_gap[1]:
        return Estimate(None, None, Verdict("the gap's interval includes 1 (no gap to share)"))
    with np.errstate(divide="ignore", invalid="ignore"):
        draws = explained.draws / gap.draws
    ci = percentile_interval(draws)
    return Estimate(
        float(explained.point / gap.point),
        ci,
        Verdict.first(None if ci else "the share has too few finite draws"),
    )
