"""Optuna bookkeeping of a study: one Optuna study per cell, plus one per cell for extra runs.

The Optuna storage is the sweep's state. Tuned cells ask the seeded TPE sampler, or, with an LR
grid, run the grid's enqueued points and the extensions queued as results come in; the extra
studies hold fixed, enqueued runs (each cell's best point re-run with more seeds, and the shared
(LR, batch) arm), so a restarted driver finds every kind of pending work in one place.
"""

from __future__ import annotations

import functools
import warnings
import zlib

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from k3scale.sweep import grid as lr_grid
from k3scale.sweep.declaration import LRGrid, StudyPreset
from k3scale.sweep.planner import Cell

TUNED, SEED, SHARED = "tuned", "seed", "shared"


def tuning_distributions(preset: StudyPreset) -> dict:
    if preset.lr_grid is not None:
        # Wide enough for every extension: a stored trial's LR must lie inside its distribution.
        low, high = preset.lr_span()
        return {
            "lr": FloatDistribution(low, high, log=True),
            "batch_size": CategoricalDistribution([preset.lr_grid.batch_size]),
        }
    space = preset.search
    return {
        "lr": FloatDistribution(space.lr_low, space.lr_high, log=True),
        "batch_size": CategoricalDistribution(list(space.batch_sizes)),
    }


def extra_distributions(preset: StudyPreset) -> dict:
    return {
        **tuning_distributions(preset),
        "seed": IntDistribution(0, 2**31 - 1),
        "arm": CategoricalDistribution([SEED, SHARED]),
    }


@functools.lru_cache(maxsize=8)  # bounded: a test session opens hundreds of throwaway stores
def open_storage(url: str | None) -> optuna.storages.RDBStorage | None:
    """One storage (one connection pool) per URL for the whole process.

    A server database (PostgreSQL, MySQL) gets `pool_pre_ping`: a connection the server dropped
    (a restart, an idle timeout) is replaced instead of failing the driver's next write. Optuna
    turns it on for MySQL only. None stays None: Optuna's in-memory storage (gpu_check's
    sampler study).
    """
    if url is None:
        return None
    if url.startswith("sqlite"):
        return optuna.storages.RDBStorage(url)
    return optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True})


def _named(study: optuna.Study, metric: str) -> optuna.Study:
    """`study` with its objective named (optuna-dashboard shows "Objective 0" otherwise)."""
    if study.metric_names is None:
        with warnings.catch_warnings():
            # set_metric_names is marked experimental in Optuna 5; its stored form is stable.
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([metric])
    return study


def open_cell_study(
    storage: str, cell: Cell, seed: int, sampled: bool = True, metric: str = "objective"
) -> optuna.Study:
    """The cell's tuning study (created once; seeded TPE, multivariate, constant liar), its
    objective named `metric`.

    The sampler's seed also depends on how many trials the study already holds: a restarted
    driver's fresh sampler would otherwise replay the first driver's random start-up points.
    `sampled=False` (an LR grid: every trial is enqueued with fixed params) gives it a random
    sampler that is never consulted: TPE would still read the whole study at every ask.
    """
    study = optuna.create_study(
        storage=open_storage(storage),
        study_name=cell.key,
        direction="minimize",
        load_if_exists=True,
    )
    _named(study, metric)
    if not sampled:
        study.sampler = optuna.samplers.RandomSampler(seed=seed)
        return study
    history = len(study.get_trials(deepcopy=False))
    study.sampler = optuna.samplers.TPESampler(
        seed=(seed * 1_000_003 + zlib.crc32(cell.key.encode()) + 7_919 * history) % 2**31,
        multivariate=True,
        constant_liar=True,
        n_startup_trials=5,
    )
    return study


def study_names(storage: str) -> set[str]:
    """The names of the studies `storage` holds."""
    return {s.study_name for s in optuna.get_all_study_summaries(open_storage(storage))}


def extra_name(cell: Cell) -> str:
    return f"{cell.key}|extra"


def open_extra_study(storage: str, cell: Cell, metric: str = "objective") -> optuna.Study:
    """The cell's study of fixed extra runs (seeds, shared arm), its objective named `metric`."""
    study = optuna.create_study(
        storage=open_storage(storage),
        study_name=extra_name(cell),
        direction="minimize",
        load_if_exists=True,
    )
    return _named(study, metric)


def count(study: optuna.Study, *states: TrialState) -> int:
    return len(study.get_trials(deepcopy=False, states=states))


def stale_running(study: optuna.Study) -> list[optuna.trial.Trial]:
    """Trials a previous driver left RUNNING: they are launched again (their run resumes)."""
    return [
        # Trial(study, id) re-attaches to a stored trial so it can be told by this driver.
        optuna.trial.Trial(study, t._trial_id)
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    ]


def best_params(study: optuna.Study) -> dict | None:
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not done:
        return None
    best = min(done, key=lambda t: (t.value, t.number))
    return {"lr": best.params["lr"], "batch_size": best.params["batch_size"]}


def enqueue_extra(study: optuna.Study, params: dict, seed: int, arm: str) -> None:
    """Queue one fixed run (idempotent: the same run is never queued twice)."""
    study.enqueue_trial({**params, "seed": seed, "arm": arm}, skip_if_exists=True)


def enqueue_grid(study: optuna.Study, grid: LRGrid) -> None:
    """Queue the grid's points (idempotent: a resumed driver queues nothing twice)."""
    for lr in lr_grid.grid_lrs(grid):
        enqueue_lr(study, lr, grid)


def enqueue_lr(study: optuna.Study, lr: float, grid: LRGrid) -> None:
    study.enqueue_trial({"lr": lr, "batch_size": grid.batch_size}, skip_if_exists=True)


def grid_extensions(
    driving: optuna.Study, budgets: list[optuna.Study], grid: LRGrid
) -> list[float]:
    """LRs to add to `driving`'s grid: one beyond each end that holds the best of one of the
    `budgets` studies, new to `driving`, while extensions are left (`driving`'s trials count
    them). `budgets` are the studies `driving`'s trials report to: itself, and the branch
    cells of a shared WSD trunk. Call it once `driving` has nothing running or waiting."""
    tried = [t.params["lr"] for t in driving.get_trials(deepcopy=False) if "lr" in t.params]
    done = lr_grid.count_extensions(tried, grid)
    found: list[float] = []
    for study in budgets:
        best = best_params(study)
        if best is None:
            continue
        lr = lr_grid.next_extension(tried, best["lr"], grid, done + len(found))
        if lr is not None and not any(lr_grid.same_lr(lr, old, grid) for old in tried + found):
            found.append(lr)
    return found


def without_password(storage: str) -> str:
    """`storage` as it may be written down (study.json, logs): a URL's password as `***`."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(storage).render_as_string(hide_password=True)
    except Exception:  # not a SQLAlchemy URL (Optuna also takes journal paths): nothing to hide
        return storage
