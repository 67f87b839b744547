"""Seeded non-parametric bootstrap over independent units (runs, cells), parallel over processes.

All resample indices are drawn up front from one `numpy.random.default_rng(seed)`, so the result
does not depend on the number of workers or on scheduling: the same seed gives the same draws.
Refit functions must be module-level (picklable) and return a 1-D float vector (NaN on failure).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from k3scale.scaling.values.uncertainty import LEVEL, percentile_interval

# 95% percentile intervals, as Epoch (arXiv:2404.10102) and Porian et al. report: the level of
# every interval in k3scale/scaling.
DEFAULT_LEVEL = LEVEL
DEFAULT_RESAMPLES = 1000
# Starting a spawned worker costs about a second; below this many refits per worker the pool
# is slower than one process (the draws, hence the result, are the same either way).
MIN_RESAMPLES_PER_WORKER = 10


@dataclasses.dataclass(frozen=True)
class BootstrapDraws:
    """Refit values of every resample.

    Attributes:
        names: names of the vector entries [P].
        values: [B, P] refit values; rows of NaN are failed refits.
        seed: the seed the indices came from.
        unit: what was resampled ("runs", "cells", "trials within cell").
    """

    names: tuple[str, ...]
    values: np.ndarray
    seed: int
    unit: str

    @property
    def num_failed(self) -> int:
        return int(np.isnan(self.values).all(axis=1).sum())

    def intervals(self, level: float = DEFAULT_LEVEL) -> dict[str, list[float]]:
        """Percentile interval per name over the finite refits; [nan, nan] where none is finite.

        Any number of finite refits gives an interval here (min_draws=1): callers report the
        refit count beside it (`summary`).
        """
        return {
            name: percentile_interval(self.values[:, j], level, min_draws=1) or [np.nan, np.nan]
            for j, name in enumerate(self.names)
        }

    def defined_share(self, name: str) -> float:
        """Share of resamples (failed refits included) whose `name` is finite."""
        column = self.values[:, self.names.index(name)]
        return float(np.isfinite(column).mean()) if len(column) else 0.0

    def standard_errors(self) -> dict[str, float]:
        out = {}
        for j, name in enumerate(self.names):
            col = self.values[:, j]
            col = col[np.isfinite(col)]
            with np.errstate(over="ignore", invalid="ignore"):  # huge draws give an inf SE
                out[name] = float(np.std(col, ddof=1)) if len(col) > 1 else float("nan")
        return out

    def summary(self, level: float = DEFAULT_LEVEL) -> dict:
        """JSON-able description for a FitResult's `extra["bootstrap"]`."""
        return {
            "num_resamples": int(self.values.shape[0]),
            "num_failed": self.num_failed,
            "seed": self.seed,
            "unit": self.unit,
            "level": level,
            "se": self.standard_errors(),
        }


def resample_indices(
    num_units: int, num_resamples: int, seed: int, strata: np.ndarray | None = None
) -> np.ndarray:
    """[B, num_units] indices drawn with replacement; within each stratum if `strata` is given."""
    rng = np.random.default_rng(seed)
    if strata is None:
        return rng.integers(0, num_units, size=(num_resamples, num_units))
    out = np.empty((num_resamples, num_units), dtype=np.int64)
    for label in np.unique(strata):
        members = np.flatnonzero(strata == label)
        draws = rng.integers(0, len(members), size=(num_resamples, len(members)))
        out[:, members] = members[draws]
    return out


def _refit_chunk(refit: Callable, arrays: Sequence[np.ndarray], chunk: np.ndarray) -> np.ndarray:
    # Degenerate resamples overflow; their non-finite results are counted
    # as failed refits, so the floating-point warnings would only be noise.
    with np.errstate(all="ignore"):
        return np.array([refit(*(a[idx] for a in arrays)) for idx in chunk], dtype=np.float64)


def run_bootstrap(
    refit: Callable[..., np.ndarray],
    arrays: Sequence[np.ndarray],
    names: Sequence[str],
    *,
    num_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    workers: int = 1,
    strata: np.ndarray | None = None,
    unit: str = "runs",
) -> BootstrapDraws:
    """Refit `refit(*resampled_arrays)` on `num_resamples` resamples of the rows of `arrays`.

    Args:
        refit: module-level function mapping the resampled arrays to a [P] vector.
        arrays: equal-length arrays; row i of every array is unit i.
        names: names of the P outputs.
        num_resamples: B.
        seed: seed of the index draws.
        workers: processes (1 = in this process).
        strata: optional [n] labels; resampling happens within each label independently.
        unit: what a row is, for the record.
    """
    indices = resample_indices(len(arrays[0]), num_resamples, seed, strata)
    if workers <= 1 or num_resamples < MIN_RESAMPLES_PER_WORKER * workers:
        values = _refit_chunk(refit, arrays, indices)
    else:
        chunks = np.array_split(indices, min(num_resamples, workers * 4))
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            parts = list(
                pool.map(_refit_chunk, [refit] * len(chunks), [arrays] * len(chunks), chunks)
            )
        values = np.concatenate(parts, axis=0)
    return BootstrapDraws(tuple(names), values.reshape(num_resamples, len(names)), seed, unit)
