"""Study declarations: what a study is made of, as frozen data.

A study file in `experiments/` defines `STUDY = Study(...)`: the architectures, schedules, arms
and presets. A preset fixes the size ladder, token budgets, search space, trials per cell (or an
LR grid instead), seeds and the schedule constants shared by every trial (one absolute `lr_min`
for both schedules, methods.md section 1.4). The planner expands a study and a preset into cells.
"""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, get_args

from k3scale.errors import K3ScaleError
from k3scale.models.presets import get_preset
from k3scale.sweep.grid import lr_extent

Arch = Literal["k2", "k3"]
Schedule = Literal["cosine", "wsd"]


@dataclass(frozen=True, kw_only=True)
class Arm:
    """A named variant of an architecture family, compared like an architecture: every trial of
    it is the family's trial with `overrides` applied (`k3scale.config.apply_overrides`)."""

    name: str
    """The arm's name: its cells' `arch` and its runs' arch tag."""
    base: Arch
    """The family whose ladder and trial config it starts from."""
    overrides: tuple[str, ...] = ()
    """`section.field=value` settings, e.g. `model.attnres=false`, `optim.per_head_muon=false`."""
    note: str = ""
    """What the arm switches, for people."""
    matched_by: str | None = None
    """A `model.*` width (an int field, e.g. `d_ff_dense`) set at every rung so the arm's active
    parameters equal its base's (`accounting.with_active_params`), for switches that change
    them; None keeps the switch's own N."""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9_]+", self.name or "") or self.name in get_args(Arch):
            raise K3ScaleError(
                f"arm {self.name!r}: a name of lowercase letters, digits and _, not a family"
            )
        if self.base not in get_args(Arch):
            raise K3ScaleError(f"arm {self.name}: base {self.base!r} is not one of k2, k3")


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    lr_low: float
    """Lowest peak LR searched (log-uniform); at least 10x above lr_min."""
    lr_high: float
    """Highest peak LR searched."""
    batch_sizes: tuple[int, ...]
    """Global batch sizes searched, in sequences per step (categorical)."""

    def __post_init__(self) -> None:
        _require_numbers("search space: lr_low, lr_high", (self.lr_low, self.lr_high), float)
        _require_numbers("search space: batch_sizes", self.batch_sizes, int)
        if not 0 < self.lr_low < self.lr_high:
            raise K3ScaleError(
                f"search space: need 0 < lr_low < lr_high, got {self.lr_low}, {self.lr_high}"
            )
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise K3ScaleError(
                "search space: batch_sizes must be a non-empty tuple of positive ints"
            )


@dataclass(frozen=True, kw_only=True)
class LRGrid:
    """Peak LRs on a geometric grid at one batch size, extended at an end that holds the best
    (issue 20: interior LR optima, grid spacing at most 1.6x)."""

    center: float
    """Geometric centre of the grid (peak LR)."""
    points: int
    """LRs on the grid, centre included when odd."""
    ratio: float = 1.6
    """Factor between neighbouring LRs (issue 20: at most 1.6)."""
    max_extensions: int = 3
    """LRs a cell may add beyond the grid's ends, one ratio at a time, while its best is at one."""
    batch_size: int
    """Global batch size of every grid trial, in sequences per step."""
    size_centers: dict[str, float] = field(default_factory=dict)
    """Per-size centres (model preset name -> peak LR) where a size's optimum is known to sit
    apart from `center` (a larger rung tunes lower); other sizes use `center`."""

    def __post_init__(self) -> None:
        _require_numbers("lr grid: center, ratio", (self.center, self.ratio), float)
        _require_numbers("lr grid: size_centers", tuple(self.size_centers.values()), float)
        if any(c <= 0 for c in self.size_centers.values()):
            raise K3ScaleError("lr grid: size_centers must be positive LRs")
        _require_numbers(
            "lr grid: points, max_extensions, batch_size",
            (self.points, self.max_extensions, self.batch_size),
            int,
        )
        if self.center <= 0:
            raise K3ScaleError(f"lr grid: center must be a positive LR, got {self.center}")
        if self.points < 3:
            raise K3ScaleError(
                f"lr grid: points must be >= 3 (an interior point needs two ends), got {self.points}"
            )
        # Issue 20: neighbouring LRs at most 1.6x apart.
        if not 1 < self.ratio <= 1.6:
            raise K3ScaleError(f"lr grid: ratio must be in (1, 1.6], got {self.ratio}")
        if self.max_extensions < 0:
            raise K3ScaleError(f"lr grid: max_extensions must be >= 0, got {self.max_extensions}")
        if self.batch_size < 1:
            raise K3ScaleError(f"lr grid: batch_size must be >= 1, got {self.batch_size}")

    def for_size(self, size: str) -> LRGrid:
        """The grid one model size runs: this one, centred on the size's own centre if any."""
        return replace(self, center=self.size_centers.get(size, self.center), size_centers={})


@dataclass(frozen=True, kw_only=True)
class StudyPreset:
    sizes: dict[str, tuple[str, ...]]
    """Model presets per architecture, e.g. {"k2": ("k2-t1", "k2-t2"), "k3": (...)}."""
    budgets: tuple[int, ...]
    """Token budgets D per cell (the same for every size)."""
    search: SearchSpace
    """Search space of every tuned cell (identical for both schedules); unused with `lr_grid`."""
    trials_per_cell: int
    """Tuning trials per cell; unused with `lr_grid`."""
    budgets_per_param: tuple[float, ...] = ()
    """Budgets in tokens per active parameter (issue 20: every size from <= 10 to >= 20); when
    set, each size's budgets are these times its N_active (`budgets_for`) and `budgets` is
    unused."""
    lr_grid: LRGrid | None = None
    """Tune on this LR grid (enqueued, extended at an end) instead of sampling `search`
    `trials_per_cell` times; both stay valid, as a preset without it would need them."""
    seeds: tuple[int, ...] = (0,)
    """Seed of tuning trials is seeds[0]; the others re-run each cell's best point."""
    dataset: str = "english_mix"
    """Prepared dataset the study trains on unless `--dataset` names another (its vocabulary
    must be the models')."""
    seq_len: int = 128
    """Tokens per sequence."""
    eval_tokens: int = 32_768
    """Validation tokens per split per evaluation."""
    eval_points: int = 4
    """Evaluations per run (evenly spaced in tokens, plus the final one)."""
    micro_batch_size: int = 16
    """Sequences per forward pass."""
    lr_min: float = 1e-5
    """Absolute LR floor shared by every trial of both schedules (StepLaw: 1e-5)."""
    warmup_fraction: float = 0.02
    """Warmup as a fraction of each run's budget (tokens), the same for both schedules."""
    wsd_decay_fraction: float = 0.2
    """WSD decay fraction of the whole run (Hägele et al.: 20% matches cosine)."""
    wsd_decay_shape: Literal["linear", "1-sqrt", "cosine", "square", "exponential"] = "1-sqrt"
    """WSD decay shape (fixed, not searched)."""
    share_wsd_trunks: bool = True
    """WSD trials of one (arch, size, LR, batch) share one trunk across budgets (branching)."""
    threads_per_trial: int = 1
    """CPU threads per trial (two 1-thread trials beat one 2-thread trial on 2 cores)."""
    gpus_per_trial: float = 0.0
    """GPUs per trial (GPU presets: 1)."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """Training precision."""
    compile: bool = False
    """Trials train through `torch.compile` (`train.compile`; issue 34)."""
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    """Where trials train (`train.device`); GPU presets say auto: the GPU Ray gave the trial."""
    max_retries: int = 2
    """Retries of a trial whose process died."""
    schedules: tuple[Schedule, ...] = ()
    """This preset's schedule when the study's is a setting, not the comparison (k2_vs_k3 on
    WSD trunks: one trunk per LR carries every budget); empty: the study's schedules."""

    def __post_init__(self) -> None:
        _require_numbers("preset: budgets", self.budgets, int)
        _require_numbers("preset: trials_per_cell", (self.trials_per_cell,), int)
        _require_numbers("preset: seeds", self.seeds, int)
        if self.trials_per_cell < 1:
            raise K3ScaleError("preset: trials_per_cell must be >= 1")
        if not self.budgets or min(self.budgets) < 1:
            raise K3ScaleError("preset: budgets must be positive token counts")
        if any(not (isinstance(x, int | float) and x > 0) for x in self.budgets_per_param):
            raise K3ScaleError("preset: budgets_per_param must be positive numbers")
        if self.search.lr_low < 10 * self.lr_min:
            raise K3ScaleError("preset: search.lr_low must be at least 10x lr_min (methods.md 1.4)")
        if self.lr_grid is not None and self.lr_span()[0] < 10 * self.lr_min:
            raise K3ScaleError(
                f"preset: the lr grid reaches {self.lr_span()[0]:.3g} after "
                f"{self.lr_grid.max_extensions} extensions down, below 10x lr_min "
                f"{self.lr_min:g} (methods.md 1.4)"
            )

    def budgets_for(self, size: str) -> tuple[int, ...]:
        """The budgets (tokens) of one model size: `budgets`, or `budgets_per_param` times its
        N_active rounded to whole steps of the largest batch the preset can run."""
        if not self.budgets_per_param:
            return self.budgets
        from k3scale.models import accounting

        n_active = accounting.num_params_active(get_preset(size))
        batch = self.lr_grid.batch_size if self.lr_grid else max(self.search.batch_sizes)
        step = batch * self.seq_len
        return tuple(max(step, round(r * n_active / step) * step) for r in self.budgets_per_param)

    def lr_span(self) -> tuple[float, float]:
        """Lowest and highest peak LR any trial can run: the search range, or every size's grid
        with all its extensions."""
        if self.lr_grid is None:
            return self.search.lr_low, self.search.lr_high
        extents = [
            lr_extent(self.lr_grid.for_size(size))
            for ladder in self.sizes.values()
            for size in ladder
        ] or [lr_extent(self.lr_grid)]
        return min(low for low, _ in extents), max(high for _, high in extents)

    @property
    def planned_trials_per_cell(self) -> int:
        """Tuning trials per cell before any grid extension."""
        return self.lr_grid.points if self.lr_grid is not None else self.trials_per_cell


@dataclass(frozen=True, kw_only=True)
class Study:
    name: str
    """Study name: the MLflow experiment and the study folder's name."""
    archs: tuple[Arch, ...]
    """Architectures compared."""
    schedules: tuple[Schedule, ...]
    """Schedules, each tuned separately."""
    presets: dict[str, StudyPreset]
    """Named presets: smoke, demo, cpu, gpu, cluster."""
    shared_arm: bool = False
    """Also run every schedule at one shared (LR, batch): the baseline schedule's tuned optimum."""
    objective: Literal["val_ood_loss", "val_id_loss"] = "val_ood_loss"
    """Final metric each cell minimises (the K3 report reads held-out OOD loss)."""
    description: str = ""
    """One paragraph for people: what the study asks."""
    analysis: str = ""
    """Analysis recipe in analysis/ that turns its tables into fits."""
    dashboard: str = ""
    """Dashboard layout in dashboards/."""
    extra: dict[str, str] = field(default_factory=dict)
    """Free-form notes recorded in study.json."""
    arms: tuple[Arm, ...] = ()
    """Named variants `archs` may list beside the families (an ablation's arms)."""

    def family(self, arch: str) -> Arch:
        """The family of an arch name: itself, or its arm's base."""
        return next((a.base for a in self.arms if a.name == arch), arch)

    def overrides(self, arch: str) -> tuple[str, ...]:
        """The config settings an arch name's trials carry on top of their family's."""
        return next((a.overrides for a in self.arms if a.name == arch), ())

    def matched_by(self, arch: str) -> str | None:
        """The width an arch name's model sets to match its family's active parameters."""
        return next((a.matched_by for a in self.arms if a.name == arch), None)

    def __post_init__(self) -> None:
        # The name becomes a folder, an MLflow experiment and a dashboard layout's file name.
        if not isinstance(self.name, str) or not re.fullmatch(
            r"[A-Za-z0-9_][A-Za-z0-9_.-]*", self.name
        ):
            raise K3ScaleError(f"study: name {self.name!r} must be letters, digits, _ . -")
        _require_choices(
            "study: archs", self.archs, get_args(Arch) + tuple(a.name for a in self.arms)
        )
        _require_choices("study: schedules", self.schedules, get_args(Schedule))
        for name, preset in self.presets.items():
            if preset.schedules:
                _require_choices(f"preset {name}: schedules", preset.schedules, get_args(Schedule))
                if len(self.schedules) > 1:
                    raise K3ScaleError(
                        f"study: preset {name!r} sets schedules, but {self.name} compares "
                        "schedules: every preset must run all of them"
                    )
            for arch in self.archs:
                if arch not in preset.sizes:
                    raise K3ScaleError(f"study: preset {name!r} has no sizes for arch {arch!r}")
                for size in preset.sizes[arch]:
                    # get_preset: an unknown size is an error naming the valid ones.
                    if get_preset(size).family != self.family(arch):
                        raise K3ScaleError(
                            f"study: preset {name!r} lists {size!r} under arch {arch!r}"
                        )

    def schedules_of(self, preset: StudyPreset) -> tuple[Schedule, ...]:
        """The schedules a preset runs: its own when it sets them, else the study's."""
        return preset.schedules or self.schedules

    def preset(self, name: str) -> StudyPreset:
        if name not in self.presets:
            raise K3ScaleError(
                f"study {self.name} has no preset {name!r} (has: {', '.join(self.presets)})"
            )
        return self.presets[name]


def _require_numbers(what: str, values, kind: type) -> None:
    """Finite numbers (ints where `kind` is int); a string like "1e5" is named, not compared."""
    for value in values:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not isinstance(value, kind | int) or not math.isfinite(value):
            raise K3ScaleError(f"{what}: {value!r} is not a finite {kind.__name__}")


def _require_choices(what: str, values, allowed: tuple[str, ...]) -> None:
    if not isinstance(values, tuple) or not values:
        raise K3ScaleError(f"{what} must be a non-empty tuple of {', '.join(allowed)}")
    unknown = [v for v in values if v not in allowed]
    if unknown:
        raise K3ScaleError(f"{what}: unknown {unknown[0]!r} (known: {', '.join(allowed)})")
    if len(set(values)) != len(values):
        raise K3ScaleError(f"{what}: {values} lists a name twice")


def load_study(path: str | Path) -> Study:
    """Import a study file and return its `STUDY`; any problem is one clear K3ScaleError."""
    path = Path(path)
    if not path.is_file():
        raise K3ScaleError(f"study file {path} does not exist")
    # Study files import their shared pieces from the repo root (`sweeps/`), one level up.
    root = str(path.resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    spec = importlib.util.spec_from_file_location(f"k3scale_study_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except K3ScaleError as exc:
        raise K3ScaleError(f"study file {path}: {exc}") from None
    except Exception as exc:
        raise K3ScaleError(
            f"study file {path} cannot be loaded: {type(exc).__name__}: {exc}"
        ) from None
    study = getattr(module, "STUDY", None)
    if not isinstance(study, Study):
        raise K3ScaleError(f"study file {path} must define STUDY = Study(...)")
    return study
