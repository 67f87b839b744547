"""Study-level analysis on the run table: the building blocks that `analysis/*.py` recipes use.

Each function takes the `runs` table (tables.RUN_SCHEMA) and `StudyOptions`, names every
exclusion it makes, and returns JSON-able dicts (typed results serialised via `to_json`).
Arms (k3scale/sweep/sources.py): "tuned" trials drive the optima; "seed" re-runs of a cell's best
point measure seed noise; "shared" runs put a schedule at the reference schedule's best point.
Every reported number has one estimator: cell optima (`optimum`), differences between schedules
(`schedule_compare`), compute-optimal frontiers and M(C) (`compute_optimal`), HP laws
(`powerlaw`) and IsoFLOP minima (`isoflop`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl

from k3scale.errors import K3ScaleError
from k3scale.scaling.estimates import compute_optimal, optimum, rerun_check, seed_effects
from k3scale.scaling.estimates.schedule_compare import (
    CellComparison,
    SeedRuns,
    compare_cell,
    pooled,
)
from k3scale.scaling.laws.isoflop import compute_level, fit_isoflop
from k3scale.scaling.laws.powerlaw import fit_power_law
from k3scale.scaling.values import verdict
from k3scale.scaling.values.fitdoc import (
    HP_TARGETS,
    CellOptimumRecord,
    Comparison,
    ScheduleComparison,
    SkippedFit,
)
from k3scale.scaling.values.uncertainty import Estimate
from k3scale.track import schema

TUNED, SEED, SHARED = "tuned", "seed", "shared"
CELL_KEYS = ("arch", "schedule", "size", "budget_tokens")


@dataclasses.dataclass(frozen=True, kw_only=True)
class StudyOptions:
    """Options every recipe records in its artifact.

    Attributes:
        loss: loss column (K3 reads held-out OOD validation loss).
        computes: FLOP conventions to report ("c_6n" = 6 N_active D, "c_attn" incl. attention).
        n_col: parameter count used as N ("n_active" per K3 Table 1, or "n_total").
        batch_col: batch column for HP optima ("batch_tokens": tokens per step).
        num_resamples: bootstrap resamples (and draws of each cell optimum) for every interval.
        seed: bootstrap seed.
        workers: processes for bootstraps.
        multiplier_decades: a multiplier interval wider than this is "not identified".
    """

    loss: str = "final_val_ood_loss"
    computes: tuple[str, ...] = ("c_6n", "c_attn")
    n_col: str = "n_active"
    batch_col: str = "batch_tokens"
    num_resamples: int = 1000
    seed: int = 0
    workers: int = 1
    multiplier_decades: float = verdict.MULTIPLIER_DECADES

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def usable_runs(runs: pl.DataFrame, opts: StudyOptions) -> tuple[pl.DataFrame, dict]:
    """Finished runs with a finite positive loss and compute; exclusions counted by reason."""
    needed = [opts.loss, opts.n_col, opts.batch_col, "lr", "tokens", *opts.computes, *CELL_KEYS]
    missing = [c for c in needed if c not in runs.columns]
    if missing:
        raise K3ScaleError(f"analysis: run table lacks columns {missing}")
    is_finished = pl.col("status").fill_null("unknown") == schema.STATUS_FINISHED
    not_finished = runs.filter(~is_finished).with_columns(pl.col("status").fill_null("unknown"))
    finished = runs.filter(is_finished)
    bad = pl.any_horizontal(
        *(
            pl.col(c).is_null() | ~pl.col(c).cast(pl.Float64).is_finite() | (pl.col(c) <= 0)
            for c in (opts.loss, opts.n_col, opts.batch_col, "lr", "tokens", *opts.computes)
        ),
        # A run without its cell's tags (logged by hand into the experiment) belongs to no cell.
        *(pl.col(c).is_null() for c in CELL_KEYS),
    )
    kept = finished.filter(~bad)
    excluded = {
        "not_finished": not_finished.group_by("status").len().sort("status").rows(),
        "missing_or_nonpositive_values": finished.filter(bad)["run_id"].sort().to_list(),
    }
    return kept, excluded


def _cell_rows(runs: pl.DataFrame) -> list[tuple[dict, pl.DataFrame]]:
    out = []
    for key, group in runs.sort("run_id").group_by(list(CELL_KEYS), maintain_order=False):
        out.append((dict(zip(CELL_KEYS, key, strict=True)), group.sort("run_id")))
    return sorted(out, key=lambda kv: tuple(kv[0][k] for k in CELL_KEYS))


@dataclasses.dataclass(frozen=True)
class CellEstimate:
    """One cell: where it sits (N, D, compute), its optimum and the runs behind it."""

    cell: dict
    n: float
    tokens: float
    compute: dict[str, float]
    optimum: optimum.CellOptimum
    best_trial: dict
    trials: int
    seed_losses: list[float]
    level: seed_effects.SeedLevel | None = None
    """The cell's seeds at its best trial's point (None without a quadratic)."""
    reruns: SeedRuns | None = None
    """The seed re-runs at the best trial's point by seed, and the tuning seed."""

    def record(self) -> CellOptimumRecord:
        """Where the cell sits, its optimum with interval and verdict, the best trial."""
        opt = self.optimum
        return CellOptimumRecord(
            cell=self.cell,
            n=self.n,
            tokens=self.tokens,
            compute=self.compute,
            loss=Estimate(opt.loss, opt.interval(), opt.verdict),
            lr_opt=opt.lr,
            batch_opt=opt.batch,
            mode=opt.quad.mode if opt.quad else "best trial",
            trials=self.trials,
            best_trial=self.best_trial,
            seed_losses=self.seed_losses,
        )


@dataclasses.dataclass(frozen=True)
class _CellTrials:
    """A cell's runs before its optimum is estimated: its quadratic (or why none), best trial
    and seed re-runs."""

    cell: dict
    runs: pl.DataFrame
    quadratic: optimum.CellQuadratic | None
    reason: str
    best: optimum.BestTrial
    run_id: str
    trials: int
    tuned_seed: int
    reruns: pl.DataFrame
    """The seed re-runs at the best trial's point."""
    loss: str

    @property
    def seed_losses(self) -> list[float]:
        return self.reruns[self.loss].to_list()

    @property
    def noise_group(self) -> list[float]:
        """Runs at one point for the noise estimate: the re-runs, or [best, re-run] for one."""
        reruns = self.seed_losses
        return [self.best.loss, *reruns] if len(reruns) == 1 else reruns

    def _rerun_seeds(self) -> list[int]:
        """The re-runs' seeds; tables without seeds number them after the tuned seed."""
        if "seed" in self.reruns.columns and self.reruns["seed"].null_count() == 0:
            return self.reruns["seed"].to_list()
        return [self.tuned_seed + 1 + k for k in range(self.reruns.height)]

    def seed_runs(self) -> SeedRuns:
        """The re-runs by seed, for pairing with another schedule's at matched seeds."""
        return SeedRuns(self.tuned_seed, dict(zip(self._rerun_seeds(), self.seed_losses)))

    def seed_level(self) -> seed_effects.SeedLevel | None:
        """The cell's seeds at the best trial's point (None without a quadratic)."""
        if self.quadratic is None:
            return None
        row = self.quadratic.features(
            np.array([np.log(self.best.lr)]), np.array([np.log(self.best.batch)])
        )
        slot = (self.cell["arch"], self.cell["size"], self.cell["budget_tokens"])
        return seed_effects.SeedLevel(
            slot=slot,
            seeds=(self.tuned_seed, *self._rerun_seeds()),
            losses=(float(row[0] @ self.quadratic.coef), *self.seed_losses),
            tuned_leverage=float(row[0] @ self.quadratic.xtx_inv @ row[0]),
        )


def _cell_trials(cell: dict, group: pl.DataFrame, opts: StudyOptions) -> _CellTrials | None:
    tuned = group.filter(_arm(TUNED))
    if tuned.height == 0:
        return None
    lr, loss = tuned["lr"].to_numpy(), tuned[opts.loss].to_numpy()
    batch = tuned[opts.batch_col].cast(pl.Float64).to_numpy()
    quad, reason = optimum.fit_quadratic(lr, batch, loss)
    i = int(np.argmin(loss))
    best = optimum.BestTrial(lr=float(lr[i]), batch=float(batch[i]), loss=float(loss[i]))
    seeds = group.filter(_arm(SEED))
    # The driver re-runs the best trial's point; a re-run elsewhere is not at the level point.
    at_best = seeds.filter(
        np.isclose(seeds["lr"].to_numpy(), best.lr)
        & np.isclose(seeds[opts.batch_col].cast(pl.Float64).to_numpy(), best.batch)
    )
    return _CellTrials(
        cell=cell,
        runs=group,
        quadratic=quad,
        reason=reason,
        best=best,
        run_id=tuned["run_id"][i],
        trials=tuned.height,
        tuned_seed=_tuned_seed(tuned, i),
        reruns=at_best if at_best.height == seeds.height else seeds.clear(),
        loss=opts.loss,
    )


def _tuned_seed(tuned: pl.DataFrame, best: int) -> int:
    """The seed of the tuning trials (the best trial's; tables without seeds: 0)."""
    if "seed" not in tuned.columns or tuned["seed"][best] is None:
        return 0
    return int(tuned["seed"][best])


def cell_estimates(
    runs: pl.DataFrame, opts: StudyOptions
) -> tuple[list[CellEstimate], optimum.Noise]:
    """Every cell's fitted optimum with draws, and the study's run noise with its seed effects.

    Where the study re-ran seeds, every optimum is levelled to its cell's seeds and its draws
    carry the seed effects (`seed_effects`); without re-runs the optima are the tuned seed's and
    the noise says that seed effects were not measured.
    """
    fitted = [t for cell, group in _cell_rows(runs) if (t := _cell_trials(cell, group, opts))]
    levels = [t.seed_level() for t in fitted]
    quads = [t.quadratic for t in fitted if t.quadratic is not None]
    groups = [t.noise_group for t in fitted if t.seed_losses]
    within = optimum.pooled_noise(quads, groups, seeds_modelled=True)
    within_sd = within.parts["quadratic_residual_sd"] or 0.0
    components = seed_effects.estimate_components(
        [lv for lv in levels if lv], within_sd, within.parts["quadratic_df"]
    )
    noise = within if components is not None else optimum.pooled_noise(quads, groups)
    if components is not None and components.within_seed_df > within.df:
        noise = optimum.Noise(
            sd=components.within_seed_sd,
            df=components.within_seed_df,
            parts={**within.parts, "method": POOLED_E},
        )
    noise = dataclasses.replace(noise, seeds=components)
    errors = (
        seed_effects.level_error_draws(
            components, levels, opts.num_resamples, np.random.default_rng([opts.seed, 48])
        )
        if components is not None and opts.num_resamples > 0
        else [None] * len(fitted)
    )
    out = []
    for i, (t, lv, err) in enumerate(zip(fitted, levels, errors, strict=True)):
        rng = np.random.default_rng([opts.seed, i])
        level = None
        if lv is not None and components is not None:
            level = optimum.Level(t.best.lr, t.best.batch, tuple(t.seed_losses), err)
        est = optimum.estimate_optimum(
            t.quadratic, t.reason, t.best, noise, opts.num_resamples, rng, level
        )
        out.append(
            CellEstimate(
                cell=t.cell,
                n=float(t.runs[opts.n_col].median()),
                tokens=float(t.runs["tokens"].median()),
                compute={c: float(t.runs[c].median()) for c in opts.computes},
                optimum=est,
                best_trial={**dataclasses.asdict(t.best), "run_id": t.run_id},
                trials=t.trials,
                seed_losses=t.seed_losses,
                level=lv,
                reruns=t.seed_runs(),
            )
        )
    return out, noise


POOLED_E = (
    "within-seed noise pooled from the quadratics' residuals and the re-runs (no seed effect "
    "within cells beyond it); seed effects apart"
)


def rerun_coverage(estimates: list[CellEstimate], noise: optimum.Noise, opts: StudyOptions) -> dict:
    """The re-runs against their seeds' predictive intervals (`rerun_check`), identified
    cells only."""
    kept = [e for e in estimates if e.optimum.identified]
    # The residuals' e, as `cell_estimates` gave it to the components (the re-runs re-pool it).
    within = (noise.parts.get("quadratic_residual_sd") or 0.0, noise.parts.get("quadratic_df", 0))
    coverage = rerun_check.check_reruns(
        [e.cell for e in kept], [e.level for e in kept], opts.seed, *within
    )
    return coverage.to_json()


def cell_records(estimates: list[CellEstimate]) -> list[CellOptimumRecord]:
    """Per cell: where it sits, its optimum with interval and verdict, the best trial."""
    return [e.record() for e in estimates]


def design_cells(estimates: list[CellEstimate]):
    """`key(e)` -> (rung, budget rank) of a cell: "k3-t2" and "k2-t2" are the same rung of two
    arms' ladders, and a budget is matched by its rank among its size's budgets, so designs with
    one token budget list and designs with budgets in tokens per parameter (each size its own
    token counts, issue 20) pair the same way."""
    budgets: dict[tuple[str, str], set[int]] = {}
    for e in estimates:
        budgets.setdefault((e.cell["arch"], e.cell["size"]), set()).add(e.cell["budget_tokens"])
    ranks = {key: sorted(values) for key, values in budgets.items()}

    def key(e: CellEstimate) -> tuple[str, int]:
        size, budget = e.cell["size"], e.cell["budget_tokens"]
        return size.rsplit("-", 1)[-1], ranks[(e.cell["arch"], size)].index(budget)

    return key


def arm_optima(estimates: list[CellEstimate], group_key: str, conv: str) -> dict:
    """Identified cell optima per group as compute_optimal.ArmOptima (one FLOP convention).

    Only design cells (rung, budget rank) identified in every group enter: frontiers over different
    subsets of the design would differ by which cells happened to be identified, not by arm.
    """
    groups = sorted({e.cell[group_key] for e in estimates})
    if not groups:
        return {}
    _design_cell = design_cells(estimates)
    common = set.intersection(
        *(
            {_design_cell(e) for e in estimates if e.cell[group_key] == g and e.optimum.identified}
            for g in groups
        )
    )
    arms = {}
    for g in groups:
        mine = [
            e
            for e in estimates
            if e.cell[group_key] == g and e.optimum.identified and _design_cell(e) in common
        ]
        if mine and all(e.optimum.draws is not None for e in mine):
            arms[g] = arm_of_cells(g, mine, conv)
    return arms


def arm_of_cells(name: str, cells: list[CellEstimate], conv: str) -> compute_optimal.ArmOptima:
    """Cells with identified optima and draws as one arm's compute_optimal.ArmOptima."""
    return compute_optimal.ArmOptima(
        name=name,
        n=np.array([e.n for e in cells]),
        d=np.array([e.tokens for e in cells]),
        compute=np.array([e.compute[conv] for e in cells]),
        loss=np.array([e.optimum.loss for e in cells]),
        draws=np.column_stack([e.optimum.draws for e in cells]),
    )


def compute_optimal_comparison(
    estimates: list[CellEstimate], group_key: str, baseline: str, opts: StudyOptions
) -> dict:
    """Both frontier routes per group and M(C) over `baseline`, once per FLOP convention.

    The surface does not depend on the convention: each group's is fitted once and read under
    every convention.
    """
    out, surfaces = {}, {}
    for conv in opts.computes:
        arms = arm_optima(estimates, group_key, conv)
        if baseline not in arms or len(arms) < 2:
            why = (
                f"needs identified cell optima of {baseline} and another {group_key} "
                f"(have {', '.join(sorted(arms)) or 'none'})"
            )
            out[conv] = Comparison(baseline, skipped=why).to_json()
            continue
        if not any(compute_optimal.route_skip_reason(a, "surface") for a in arms.values()):
            for name, arm in arms.items():
                if name not in surfaces:
                    surfaces[name] = compute_optimal.fit_arm_surface(arm)
        comparison = compute_optimal.compare_arms(arms, baseline, opts.multiplier_decades, surfaces)
        out[conv] = comparison.to_json()
    return out


def schedule_comparison(
    estimates: list[CellEstimate], noise: optimum.Noise, reference: str, opts: StudyOptions
) -> dict:
    """Per (arch, size, budget): every schedule vs `reference`; pooled over cells, and on the
    re-runs at the chosen points paired by seed (`schedule_compare.selection_free`)."""
    by_cell: dict[tuple, dict[str, CellEstimate]] = {}
    for e in estimates:
        key = (e.cell["arch"], e.cell["size"], e.cell["budget_tokens"])
        by_cell.setdefault(key, {})[e.cell["schedule"]] = e
    per_other: dict[str, list[CellComparison]] = {}
    clusters: dict[str, list[tuple[str, str]]] = {}
    for key, schedules in sorted(by_cell.items()):
        if reference not in schedules or len(schedules) < 2:
            continue
        cell = dict(zip(("arch", "size", "budget_tokens"), key, strict=True))
        for other in sorted(set(schedules) - {reference}):
            ref, oth = schedules[reference], schedules[other]
            reruns = (ref.reruns, oth.reruns) if ref.reruns and oth.reruns else None
            result = compare_cell(ref.optimum, oth.optimum, reference, other, cell, reruns)
            per_other.setdefault(other, []).append(result)
            clusters.setdefault(other, []).append(key[:2])
    comparison = ScheduleComparison(
        reference=reference,
        cells=sorted(
            (c.difference for entries in per_other.values() for c in entries),
            key=lambda d: (d.cell["arch"], d.cell["size"], d.cell["budget_tokens"], d.other),
        ),
        pooled={o: pooled(e, clusters[o], reference, o) for o, e in per_other.items()},
        run_noise=noise.to_dict(),
    )
    return comparison.to_json()


def _arm(arm: str) -> pl.Expr:
    """Rows of one arm; runs logged without an arm tag are tuning trials."""
    if arm == TUNED:
        return pl.col("arm").is_null() | (pl.col("arm") == TUNED)
    return pl.col("arm") == arm


def hp_laws(optima: list[CellOptimumRecord], compute: str, opts: StudyOptions) -> dict:
    """lr_opt and batch_opt power laws from cell optima that are interior minima.

    Two forms: of compute C (DeepSeek LLM 2024) and of (N, D) jointly (StepLaw, Li et al. 2025;
    Bjorck et al. 2025), the latter only when N and D both vary over at least 4 cells.
    """
    ok = [o for o in optima if o.loss.identified]
    if len({o.compute[compute] for o in ok}) < 3:
        return SkippedFit(f"needs >= 3 cells with interior optima, got {len(ok)}").to_json()
    regressors = {"C": {"C": np.array([o.compute[compute] for o in ok])}}
    n, d = np.array([o.n for o in ok]), np.array([o.tokens for o in ok])
    if len(ok) >= 4 and len(np.unique(n)) >= 2 and len(np.unique(d)) >= 2:
        regressors["N,D"] = {"N": n, "D": d}
    out = {}
    for name in HP_TARGETS:
        y = np.array([getattr(o, name) for o in ok])
        if len(np.unique(y)) < 2:
            out[name] = SkippedFit(f"{name} constant over cells").to_json()
            continue
        out[name] = {}
        for form, inputs in regressors.items():
            try:
                out[name][form] = fit_power_law(
                    inputs,
                    y,
                    num_resamples=opts.num_resamples,
                    seed=opts.seed,
                    target=f"{name}({form})",
                    units={"C": f"FLOPs ({compute})", "N": opts.n_col, "D": "tokens"},
                ).to_dict()
            except K3ScaleError as exc:
                out[name][form] = SkippedFit(str(exc)).to_json()
    return out


def isoflop(optima: list[CellOptimumRecord], compute: str, opts: StudyOptions) -> dict:
    """Approach 2 where budgets (bucketed to 2 significant digits of C) hold >= 3 sizes."""
    optima = [o for o in optima if o.loss.identified]
    c = np.array([compute_level(o.compute[compute]) for o in optima])
    try:
        fit = fit_isoflop(
            c,
            np.array([o.n for o in optima]),
            [o.loss.value for o in optima],
            method="akima",
            num_resamples=opts.num_resamples,
            seed=opts.seed,
        )
    except K3ScaleError as exc:
        return SkippedFit(str(exc)).to_json()
    return fit.to_dict()
