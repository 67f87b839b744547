"""Synthetic studies with a known truth, laid out like a study preset (methods.md 4.6).

A `Design` is what a preset runs: its cells (arch, size with N and FLOPs per token, budget,
schedule), the search space and trials per cell, the seeds re-run at each cell's best trial, the
shared arm, and WSD trunks shared across budgets. A `Truth` is a loss landscape:

    L = L_arch(N, D) + offset(schedule) + kappa_lr (log lr - log lr*)^2 + kappa_b (log b - log b*)^2

with L_base = E + A N^-alpha + B D^-beta (Chinchilla form), the new architecture's surface
L_base(N k^a, D k^b) with a = beta / (alpha + beta), b = 1 - a (so its compute-optimal frontier
is the baseline's at k times the compute: a known multiplier k under 6 N D), WSD offset by
-schedule_diff (schedule_diff = L_cosine - L_wsd at own optima), lr* moving with N and D and by a
factor for WSD, Gaussian run noise (WSD branches of one trunk share part of it), and seed
effects (methods.md 4.8): u per seed across the study, w per cell and seed (cells of one
(arch, size, budget) share part of it); the tuning trials all run the design's first seed.

`simulate_runs` returns the run table a real study exports (the columns `k3scale fit` reads), so
the analysis runs on it unchanged. Tuning trials are drawn at random from the search space:
the studies' TPE sampler proposes its first 5 trials at random (n_startup_trials=5), so for the
presets' 3-6 trials per cell this matches all or all but one of them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl

from k3scale.scaling.inputs.tables import CURVE_SCHEMA, RUN_SCHEMA
from k3scale.track import schema


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimCell:
    arch: str
    size: str
    n: float
    """Active parameters."""
    flops_per_token_6n: float
    flops_per_token_attn: float
    budget_tokens: int
    schedule: str
    key: str = ""
    """The cell's name in the run table (the planner's `Cell.key`: an arm's cells carry the
    arm's name before its family's size); default size|D|schedule."""

    @property
    def name(self) -> str:
        return self.key or f"{self.size}|D{self.budget_tokens}|{self.schedule}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Design:
    """A study preset's layout (see `k3scale.bench.calibrate.design_from_study`)."""

    study: str
    cells: tuple[SimCell, ...]
    lr_range: tuple[float, float]
    batch_sizes: tuple[int, ...]
    """Sequences per step."""
    seq_len: int
    trials_per_cell: int
    seeds: tuple[int, ...]
    shared_arm: bool
    share_wsd_trunks: bool
    lr_grid: tuple[float, ...] = ()
    """When set, every cell runs exactly these LRs at each batch size (a grid design)."""
    size_lr_scale: tuple[tuple[str, float], ...] = ()
    """(size, factor): a size whose grid is `lr_grid` times factor, centred where the design
    expects that size's optimum; the truth's lr* then follows the grid centres (with D)."""
    lr_grid_ratio: float = 1.6
    """Spacing of `lr_grid`: an extension is one such step past an end."""
    max_extensions: int = 0
    """LRs a grid may add past its ends while a cell's best sits at one (the driver's rule:
    k3scale/sweep/grid.py `next_extension`), counted per tuning study (a WSD trunk's)."""

    def lr_scale(self, size: str) -> float:
        return dict(self.size_lr_scale).get(size, 1.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Truth:
    """The known landscape. Defaults give losses, curvatures and noise like the cpu studies."""

    E: float = 4.5
    A: float = 40.0
    alpha: float = 0.3
    B: float = 60.0
    beta: float = 0.3
    baseline_arch: str = "k2"
    multiplier: float = 1.0
    """Compute multiplier of every other architecture over the baseline (6 N D convention)."""
    arch_multipliers: tuple[tuple[str, float], ...] = ()
    """(arch, k): an architecture whose multiplier over the baseline is k, not `multiplier`
    (an ablation's arms: the full model's multiplier over the component's worth)."""
    schedule_diff: float = 0.0
    """L_cosine - L_wsd at each schedule's own optimum (negative: cosine lower)."""
    lr_exponents: tuple[float, float] = (-0.25, -0.1)
    """lr* proportional to N^a D^b around the search range's geometric middle."""
    wsd_lr_factor: float = 0.8
    kappa_lr: float = 0.06
    """Loss rise per (log lr - log lr*)^2: 0.3 nats one decade from the optimum."""
    kappa_batch: float = 0.02
    noise_sd: float = 0.02
    """Per-run noise e (what the quadratics' residuals measure)."""
    trunk_share: float = 0.5
    """Share of a WSD branch's noise variance common to its trunk's branches."""
    seed_sd: float = 0.0
    """u: a seed's effect on every run of that seed in the study (methods.md 4.8)."""
    cell_seed_sd: float = 0.0
    """w: a seed's effect on the runs of one cell, beyond u."""
    slot_share: float = 0.0
    """Share of w's variance common to the cells of one (arch, size, budget) slot."""
    bend: float = 0.0
    """h: every arm's loss less h * max(0, ln(6 N D / bend_compute))^2, so that its frontier
    steepens past bend_compute, curved in log L against log C as K2's v3 optima are (issue 47):
    no power law E + K C^-alpha with E >= 0 follows it. 0: every frontier is a power law."""
    bend_compute: float = 2.5e11

    def surface(self, arch: str, schedule: str) -> np.ndarray:
        """(E, A, alpha, B, beta) of the arm's true L(N, D), schedule offset included."""
        k = 1.0 if arch == self.baseline_arch else self.multiplier
        k = dict(self.arch_multipliers).get(arch, k)
        a = self.beta / (self.alpha + self.beta)
        e = self.E - (self.schedule_diff if schedule == "wsd" else 0.0)
        return np.array(
            [
                e,
                self.A * k ** (-a * self.alpha),
                self.alpha,
                self.B * k ** (-(1 - a) * self.beta),
                self.beta,
            ]
        )

    def optimum_loss(self, cell: SimCell) -> float:
        e, a, alpha, b, beta = self.surface(cell.arch, cell.schedule)
        past = max(0.0, np.log(6 * cell.n * cell.budget_tokens / self.bend_compute))
        return float(e + a * cell.n**-alpha + b * cell.budget_tokens**-beta - self.bend * past**2)


def _lr_star(truth: Truth, design: Design, cell: SimCell, n_ref: float, d_ref: float) -> float:
    mid = np.sqrt(design.lr_range[0] * design.lr_range[1])
    a, b = truth.lr_exponents
    if design.size_lr_scale:
        # Each size's grid is centred on its expected optimum: the N dependence is in the grid.
        tokens_per_param = cell.budget_tokens / cell.n
        lr = mid * design.lr_scale(cell.size) * (tokens_per_param / (d_ref / n_ref)) ** b
    else:
        lr = mid * (cell.n / n_ref) ** a * (cell.budget_tokens / d_ref) ** b
    return lr * (truth.wsd_lr_factor if cell.schedule == "wsd" else 1.0)


def true_loss(truth: Truth, design: Design, cell: SimCell, lr, batch) -> np.ndarray:
    """Noise-free final loss of runs of `cell` at (lr, batch sequences) arrays."""
    n_ref = float(np.exp(np.mean(np.log([c.n for c in design.cells]))))
    d_ref = float(np.exp(np.mean(np.log([c.budget_tokens for c in design.cells]))))
    b_star = np.sqrt(min(design.batch_sizes) * max(design.batch_sizes))
    lr_star = _lr_star(truth, design, cell, n_ref, d_ref)
    return (
        truth.optimum_loss(cell)
        + truth.kappa_lr * np.log(np.asarray(lr) / lr_star) ** 2
        + truth.kappa_batch * np.log(np.asarray(batch) / b_star) ** 2
    )


def _trials(design: Design, rng: np.random.Generator, size: str) -> tuple[np.ndarray, np.ndarray]:
    if design.lr_grid:
        lrs = np.asarray(design.lr_grid) * design.lr_scale(size)
        lr, batch = np.meshgrid(lrs, design.batch_sizes, indexing="ij")
        return lr.ravel(), batch.ravel()
    lo, hi = np.log(design.lr_range)
    lr = np.exp(rng.uniform(lo, hi, design.trials_per_cell))
    return lr, rng.choice(np.array(design.batch_sizes), design.trials_per_cell)


def _trunk_key(design: Design, cell: SimCell) -> tuple | None:
    if cell.schedule != "wsd" or not design.share_wsd_trunks:
        return None
    return (cell.arch, cell.size)


class _SeedEffects:
    """u per seed and w per (cell, seed), drawn once per simulated study as they are needed."""

    def __init__(self, truth: Truth, rng: np.random.Generator):
        self.truth, self.rng = truth, rng
        self.shared: dict[int, float] = {}
        self.slot: dict[tuple, float] = {}
        self.cell: dict[tuple, float] = {}

    def __call__(self, cell: SimCell, seed: int) -> float:
        t = self.truth
        if not (t.seed_sd or t.cell_seed_sd):
            return 0.0
        slot = (cell.arch, cell.size, cell.budget_tokens)
        if seed not in self.shared:
            self.shared[seed] = t.seed_sd * self.rng.standard_normal()
        if (slot, seed) not in self.slot:
            self.slot[(slot, seed)] = self.rng.standard_normal()
        key = (slot, cell.schedule, seed)
        if key not in self.cell:
            own = self.rng.standard_normal()
            mix = np.sqrt(t.slot_share) * self.slot[(slot, seed)] + np.sqrt(1 - t.slot_share) * own
            self.cell[key] = t.cell_seed_sd * mix
        return self.shared[seed] + self.cell[key]


@dataclasses.dataclass
class _Tuning:
    """The tuning trials of one tuning study: a cell, or the branch cells of one WSD trunk,
    which share its LRs and part of its noise."""

    cells: list[SimCell]
    lr: list[float]
    batch: list[float]
    common: list[float]
    own: dict[int, list[float]]
    base_points: int

    def losses(self, design: Design, truth: Truth, share: float, seed_effect) -> list[np.ndarray]:
        lr, batch = np.array(self.lr), np.array(self.batch)
        out = []
        for k, cell in enumerate(self.cells):
            noise = np.sqrt(share) * np.array(self.common) + np.sqrt(1 - share) * np.array(
                self.own[k]
            )
            loss = true_loss(truth, design, cell, lr, batch) + truth.noise_sd * noise
            out.append(loss + seed_effect(cell, design.seeds[0]))
        return out

    def add(self, lr: float, rng: np.random.Generator) -> None:
        self.lr.append(lr)
        self.batch.append(self.batch[0])
        self.common.append(float(rng.standard_normal()))
        for values in self.own.values():
            values.append(float(rng.standard_normal()))


def _extensions(design: Design, tuning: _Tuning, losses: list[np.ndarray]) -> list[float]:
    """LRs one grid step past each end that holds a cell's best, while extensions are left."""
    log_step = np.log(design.lr_grid_ratio)
    tried = np.log(tuning.lr)
    lo, hi = tried.min(), tried.max()
    found: list[float] = []
    for loss in losses:
        if len(tuning.lr) - tuning.base_points + len(found) >= design.max_extensions:
            break
        best = tried[int(np.argmin(loss))]
        target = lo - log_step if best - lo < 1e-6 else hi + log_step if hi - best < 1e-6 else None
        if target is not None and not any(abs(np.log(x) - target) < 1e-6 for x in found):
            found.append(float(np.exp(target)))
    return found


def _tune(design: Design, truth: Truth, rng, cells: list[SimCell], share: float, effect):
    """The tuning study of `cells` (one cell, or a trunk's branches), its grid extended as the
    driver extends it; (tuning, each cell's losses)."""
    lr, batch = _trials(design, rng, cells[0].size)
    common = rng.standard_normal(len(lr)).tolist()
    own = {k: rng.standard_normal(len(lr)).tolist() for k in range(len(cells))}
    tuning = _Tuning(cells, lr.tolist(), batch.tolist(), common, own, len(lr))
    while True:
        losses = tuning.losses(design, truth, share, effect)
        new = _extensions(design, tuning, losses) if design.lr_grid else []
        if not new:
            return tuning, losses
        for x in new:
            tuning.add(x, rng)


def simulate_runs(design: Design, truth: Truth, seed: int) -> pl.DataFrame:
    """One synthetic study's run table (tuned trials with grid extensions, seed re-runs, shared
    arm)."""
    rng = np.random.default_rng(seed)
    seed_effect = _SeedEffects(truth, np.random.default_rng([seed, 48]))
    rows: list[dict] = []
    best_of: dict[tuple, tuple[float, int]] = {}
    groups: dict[object, list[SimCell]] = {}
    for cell in sorted(design.cells, key=lambda c: -c.budget_tokens):  # trunks: the largest
        key = _trunk_key(design, cell)
        groups.setdefault(key if key is not None else id(cell), []).append(cell)
    for cells in groups.values():
        trunk = _trunk_key(design, cells[0]) is not None
        share = truth.trunk_share if trunk else 0.0
        tuning, losses = _tune(design, truth, rng, cells, share, seed_effect)
        for cell, loss in zip(cells, losses, strict=True):
            for i in range(len(loss)):
                lr, batch = tuning.lr[i], tuning.batch[i]
                rows.append(_row(design, cell, "tuned", lr, batch, loss[i], design.seeds[0]))
            i = int(np.argmin(loss))
            lr, batch = tuning.lr[i], tuning.batch[i]
            best_of[(cell.arch, cell.size, cell.budget_tokens, cell.schedule)] = (lr, batch)
            for s in design.seeds[1:]:
                value = true_loss(truth, design, cell, lr, batch)
                value = value + truth.noise_sd * rng.standard_normal() + seed_effect(cell, s)
                rows.append(_row(design, cell, "seed", lr, batch, value, s))
    if design.shared_arm:
        for cell in sorted(design.cells, key=lambda c: -c.budget_tokens):
            if cell.schedule == "cosine":
                continue
            lr, batch = best_of[(cell.arch, cell.size, cell.budget_tokens, "cosine")]
            value = (
                true_loss(truth, design, cell, lr, batch)
                + truth.noise_sd * rng.standard_normal()
                + seed_effect(cell, design.seeds[0])
            )
            rows.append(_row(design, cell, "shared", lr, batch, value, design.seeds[0]))
    table = pl.DataFrame(rows)
    return table.with_columns(
        pl.format("sim-{}", pl.int_range(pl.len()).cast(pl.String).str.zfill(5)).alias("run_id")
    )


def _row(design: Design, cell: SimCell, arm: str, lr, batch, loss, seed: int) -> dict:
    batch_tokens = int(batch) * design.seq_len
    return {
        "status": schema.STATUS_FINISHED,
        "study": design.study,
        "cell": cell.name,
        "arm": arm,
        "arch": cell.arch,
        "schedule": cell.schedule,
        "size": cell.size,
        "budget_tokens": cell.budget_tokens,
        "seed": seed,
        "lr": float(lr),
        "batch_size": int(batch),
        "seq_len": design.seq_len,
        "batch_tokens": batch_tokens,
        "n_active": int(cell.n),
        "tokens": cell.budget_tokens,
        "c_6n": cell.flops_per_token_6n * cell.budget_tokens,
        "c_attn": cell.flops_per_token_attn * cell.budget_tokens,
        "final_val_ood_loss": float(loss),
    }


def simulated_tables(design: Design, truth: Truth, seed: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """`simulate_runs` in the exported tables' schema (runs.parquet, an empty curves.parquet),
    so `k3scale fit <recipe> --from DIR` reads it like a real study's export."""
    runs = simulate_runs(design, truth, seed)
    runs = runs.with_columns(experiment=pl.lit(design.study))
    missing = [pl.lit(None, dtype).alias(c) for c, dtype in RUN_SCHEMA.items() if c not in runs]
    runs = runs.with_columns(missing)
    runs = runs.select([pl.col(c).cast(t) for c, t in RUN_SCHEMA.items()])
    curves = pl.DataFrame(schema=CURVE_SCHEMA)
    return runs, curves
