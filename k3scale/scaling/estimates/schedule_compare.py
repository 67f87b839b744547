"""Schedule comparison within a cell and pooled over cells (methods.md 3.4, 4.7).

Sign convention everywhere: diff = L_reference - L_other, so a negative value means the
reference schedule (cosine) ends lower.

Per (arch, size, budget) cell, from each schedule's fitted optimum (k3scale/scaling/estimates/optimum.py):
- "own": each schedule at its own tuned optimum (per-schedule tuning, the K3 report's reading);
- "shared": both at the reference's optimum (the other schedule's quadratic read there).
Both optima are levelled to their cells' seeds; the intervals come from the two cells' draws,
which share the seeds' effects where the cells share seeds (`seed_effects`): a difference at
matched seeds is paired. Over cells, the pooled reading that
the word "consistently" needs: the mean difference over identified cells with its interval from
the cells' draws (paired through the seeds they share), the sign count, and a t-interval over
independent clusters of cells that does not lean on the seed model. Each schedule's point was
chosen on the tuning seed, so every reading that includes that seed carries the selection's luck
(issue 47 item 2, methods.md 4.11): the selection-free reading pairs the seed re-runs at the
chosen points, seed by seed, and leaves the tuning seed out.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.stats import t as t_dist

from k3scale.scaling.estimates.optimum import CellOptimum
from k3scale.scaling.values.fitdoc import CellDifference, PooledDifference, sign_text
from k3scale.scaling.values.uncertainty import MIN_INTERVAL_DRAWS, Estimate, percentile_interval
from k3scale.scaling.values.verdict import Verdict

# A pooled t-interval needs at least this many independent clusters of cells.
MIN_CLUSTERS = 3
# The selection-free t-interval needs at least this many paired re-runs (df = pairs - 1).
MIN_PAIRS = 3


@dataclasses.dataclass(frozen=True)
class SeedRuns:
    """A cell's seed re-runs at its chosen point, by seed, and the seed whose trials chose it."""

    tuned_seed: int
    losses: dict[int, float]


def rerun_pairs(ref: SeedRuns, other: SeedRuns) -> np.ndarray:
    """[k] ref - other at every seed both schedules re-ran at their chosen points, in seed
    order, the tuning seeds left out (their trials chose the points)."""
    seeds = sorted((set(ref.losses) & set(other.losses)) - {ref.tuned_seed, other.tuned_seed})
    return np.array([ref.losses[s] - other.losses[s] for s in seeds], dtype=float)


def _why_no_interval(draws: np.ndarray | None) -> str:
    count = 0 if draws is None else int(np.isfinite(draws).sum())
    return f"{count} finite draws of the difference (an interval needs >= {MIN_INTERVAL_DRAWS})"


def _own_draws(ref: CellOptimum, other: CellOptimum) -> np.ndarray:
    """Draws of the own-optimum difference; none when the optima were fitted without draws."""
    if ref.draws is None or other.draws is None:
        return np.empty(0)
    return ref.draws - other.draws


def _shared_draws(ref: CellOptimum, other: CellOptimum) -> tuple[float, np.ndarray | None, str]:
    """The other schedule's fitted loss at the reference's optimum, minus the reference's."""
    q_ref, q_other = ref.quad, other.quad
    u, v = np.log(ref.lr), np.log(ref.batch)
    lo, hi = q_other.u_range
    if not lo - 1e-9 <= u <= hi + 1e-9:
        return np.nan, None, f"{ref.lr:.3g} is outside the other schedule's searched LRs"
    row = q_other.features(np.array([u]), np.array([v]))
    one_batch_elsewhere = q_other.mode == "1d" and not np.isclose(v, q_other.v_range[0])
    if one_batch_elsewhere or not np.all(np.isfinite(row)):
        return np.nan, None, "the other schedule never ran the reference's batch size"
    point = ref.loss - (float((row @ q_other.coef)[0]) + other.shift)
    if ref.draw_index is None or other.coef_draws is None:
        return point, None, ""
    bu, bv = q_ref.box()
    rows = q_other.features(bu[ref.draw_index], bv[ref.draw_index])
    at_ref = np.einsum("sp,sp->s", rows, other.coef_draws)
    return point, ref.draws - other.levelled(at_ref), ""


@dataclasses.dataclass(frozen=True)
class CellComparison:
    """One cell's difference, and the draws of its own-optimum reading (None when an optimum is
    not identified; empty when the optima have no draws: the difference is then a point)."""

    difference: CellDifference
    own_draws: np.ndarray | None
    rerun_pairs: np.ndarray = dataclasses.field(default_factory=lambda: np.empty(0))
    """[k] reference - other on the re-runs at matched seeds (`rerun_pairs`; empty: none)."""


def compare_cell(
    ref: CellOptimum,
    other: CellOptimum,
    reference: str,
    name: str,
    cell: dict | None = None,
    reruns: tuple[SeedRuns, SeedRuns] | None = None,
) -> CellComparison:
    """Both readings of one cell (reference minus other) with intervals and verdicts.

    cell: where the cell sits ({arch, size, budget_tokens}), recorded on the difference.
    reruns: each schedule's re-runs at its chosen point, paired by seed for the selection-free
        reading.
    """
    reason = None
    for schedule, opt in ((reference, ref), (name, other)):
        if not reason and not opt.identified:
            reason = f"{schedule} optimum: {opt.verdict.reason}"
    own_draws = None if reason else _own_draws(ref, other)
    own_ci = percentile_interval(own_draws) if own_draws is not None else None
    own = Estimate(
        ref.loss - other.loss,
        own_ci,
        Verdict.first(reason, None if own_ci else _why_no_interval(own_draws)),
    )
    shared, shared_draws, why = (np.nan, None, "") if reason else _shared_draws(ref, other)
    shared_ci = percentile_interval(shared_draws) if shared_draws is not None else None
    at_shared = Estimate(
        None if np.isnan(shared) else shared,
        shared_ci,
        Verdict.first(reason, why, None if shared_ci else _why_no_interval(shared_draws)),
    )
    difference = CellDifference(
        cell=cell or {},
        reference=reference,
        other=name,
        own=own,
        shared=at_shared,
        lr_ratio=other.lr / ref.lr,
        batch_ratio=other.batch / ref.batch,
        losses={reference: ref.loss, name: other.loss},
    )
    pairs = rerun_pairs(*reruns) if reruns else np.empty(0)
    return CellComparison(difference, own_draws, pairs)


def _paired_mean(used: list[CellComparison]) -> Estimate:
    """The mean over cells of their own-optimum differences, its interval from the mean of the
    cells' draws: draw s of every cell shares seed s's effects (`seed_effects`), so the mean of
    paired cells keeps what their seeds share out of its spread, as a paired difference does."""
    mean = float(np.mean([e.difference.own.value for e in used]))
    lengths = {len(e.own_draws) for e in used}
    if len(lengths) != 1 or lengths == {0}:
        why = "the cells' differences have no draws of one length to pool"
        return Estimate(mean, None, Verdict(why))
    draws = np.mean([e.own_draws for e in used], axis=0)
    ci = percentile_interval(draws)
    return Estimate(mean, ci, Verdict.first(None if ci else _why_no_interval(draws)))


def _across_sizes(groups: dict[object, list[float]], used: int, cells: int) -> Estimate:
    """A t-interval over independent clusters of cells (the mean of cluster means, their spread
    as its error, df = clusters - 1): robust to a model of the noise that is wrong and to an
    effect that differs by size, at the price of few degrees of freedom."""
    if len(groups) < MIN_CLUSTERS:
        reason = (
            f"identified differences in {len(groups)} independent cluster(s) of cells "
            f"(sizes; needs >= {MIN_CLUSTERS}) over {used} of {cells} cells"
        )
        return Estimate(None, None, Verdict(reason))
    means = np.array([np.mean(v) for v in groups.values()])
    mean = float(means.mean())
    half = float(t_dist.ppf(0.975, len(means) - 1) * means.std(ddof=1) / np.sqrt(len(means)))
    return Estimate(mean, [mean - half, mean + half], Verdict())


def selection_free(pairs: np.ndarray) -> Estimate:
    """The mean of the paired re-run differences with a t-interval over the pairs.

    The tuning seed chose each schedule's point, so its differences carry the selection's luck;
    the re-runs at those points did not choose them. The t-interval (df = pairs - 1) is valid
    for the mean over these fixed cells: a difference at a matched seed cancels what the two
    schedules' runs of that seed share (u_seed, and a slot's shared part of w), so the pairs are
    independent given their cells, and their spread is the within-cell noise plus the cells'
    spread of true differences, which only widens the interval for the mean over these cells.
    """
    mean = float(np.mean(pairs)) if len(pairs) else None
    if len(pairs) < MIN_PAIRS:
        count = f"{len(pairs)} pair{'' if len(pairs) == 1 else 's'}"
        why = f"only {count} of re-runs off the tuning seed; a t-interval needs >= {MIN_PAIRS}"
        return Estimate(mean, None, Verdict(why))
    half = float(t_dist.ppf(0.975, len(pairs) - 1) * np.std(pairs, ddof=1) / np.sqrt(len(pairs)))
    return Estimate(mean, [mean - half, mean + half], Verdict())


def _selection_free_fields(used: list[CellComparison], reference: str, other: str) -> dict:
    """PooledDifference's selection-free fields from the identified cells' paired re-runs."""
    paired = [e.rerun_pairs for e in used if len(e.rerun_pairs)]
    if not paired:
        return {}
    pairs = np.concatenate(paired)
    return {
        "selection_free": selection_free(pairs),
        "pairs": len(pairs),
        "pair_cells": len(paired),
        "pair_signs": {
            f"{reference} lower": int((pairs < 0).sum()),
            f"{other} lower": int((pairs > 0).sum()),
        },
    }


def pooled(
    entries: list[CellComparison], clusters: list, reference: str, other: str
) -> PooledDifference:
    """Mean difference over identified cells, its paired interval, and the sign count; and the
    selection-free mean over the same cells' paired re-runs.

    The interval is the draws' (`_paired_mean`), which the seed model makes paired (methods.md
    4.9) and `bench calibrate` checks; `across_sizes` is the t-interval over clusters (one per
    `clusters` value, e.g. (arch, size)) that holds without the model: where the two disagree,
    the model or a constant effect is in doubt. The selection-free reading (`selection_free`)
    keeps to the identified cells: elsewhere a chosen point is an edge of the search, not the
    schedule's optimum.
    """
    used = [(e, c) for e, c in zip(entries, clusters, strict=True) if e.own_draws is not None]
    groups: dict = {}
    for e, c in used:
        groups.setdefault(c, []).append(e.difference.own.value)
    counts = {"cells": len(entries), "identified_cells": len(used), "clusters": len(groups)}
    if not used:
        reason = f"no identified difference in {len(entries)} cells"
        return PooledDifference(**counts, mean=Estimate(None, None, Verdict(reason)))
    mean = _paired_mean([e for e, _ in used])
    signs = [np.sign(e.difference.own.value) for e, _ in used]
    resolved = [sign_text(e.difference.own.interval, reference, other) for e, _ in used]
    ci = mean.interval
    return PooledDifference(
        **counts,
        mean=mean,
        across_sizes=_across_sizes(groups, len(used), len(entries)),
        point_signs={
            f"{reference} lower": int(sum(s < 0 for s in signs)),
            f"{other} lower": int(sum(s > 0 for s in signs)),
        },
        resolved_signs={s: resolved.count(s) for s in sorted(set(resolved))},
        consistent=bool(ci and len(set(signs)) == 1 and (ci[1] < 0 or ci[0] > 0)),
        **_selection_free_fields([e for e, _ in used], reference, other),
    )
