"""Log-space power-law models, the robust objective and multi-start L-BFGS-B (methods.md 2.1, 2.4).

Every parametric law here is a sum of power terms plus a constant,
`L = E + sum_k A_k * x_k^-alpha_k`, fitted in log space as
`log L_hat = LSE(a_1 - alpha_1 log x_1, ..., a_K - alpha_K log x_K, e)` with `a_k = log A_k`,
`e = log E` (Besiroglu et al. 2024, arXiv:2404.10102). The Chinchilla surface is K = 2
(x = N, D); a compute frontier is K = 1 (x = C).

Parameter vector layout, shape [2K + 1]: `[a_1..a_K, alpha_1..alpha_K, e]`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from scipy.optimize import minimize

from k3scale.scaling.laws.bootstrap import BootstrapDraws, run_bootstrap

# Epoch's protocol (arXiv:2404.10102, following Hoffmann et al. 2022): Huber delta on log residuals.
HUBER_DELTA = 1e-3
# Below this many starts per worker a spawned pool (about a second to start) does not pay off.
MIN_STARTS_PER_WORKER = 100


def single_threaded_blas() -> contextlib.AbstractContextManager:
    """Limit BLAS to one thread inside fits.

    SciPy's L-BFGS-B calls BLAS on 5x5 matrices; multi-threaded OpenBLAS makes each call cost
    milliseconds of thread hand-off on a busy machine (measured here: 28 s -> 0.9 s for one
    frontier fit with 30 bootstrap refits). threadpoolctl ships with scikit-learn/SciPy installs.
    """
    controller = _blas_controller()
    if controller is None:
        return contextlib.nullcontext()
    return controller.limit(limits=1, user_api="blas")


@functools.cache
def _blas_controller():
    """One controller per process: building it scans loaded libraries (~4 ms); `limit` is ~30 us."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    return ThreadpoolController()


@dataclasses.dataclass(frozen=True)
class LogPowerLaw:
    """Objective of a K-term log-space power law on fixed data.

    Attributes:
        log_x: [K, n] natural logs of the K inputs (N, D or C).
        log_y: [n] natural log of the loss.
        delta: Huber delta on log residuals; None means least squares (0.5 * r^2).
    """

    log_x: np.ndarray
    log_y: np.ndarray
    delta: float | None = HUBER_DELTA

    @property
    def num_terms(self) -> int:
        return self.log_x.shape[0]

    def _terms(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Stable LSE pieces: (row max [n], exp(z - max) [K+1, n], their column sum [n])."""
        k = self.num_terms
        z = np.empty((k + 1, self.log_y.shape[0]))
        np.multiply(theta[k : 2 * k, None], self.log_x, out=z[:k])
        np.subtract(theta[:k, None], z[:k], out=z[:k])
        z[k] = theta[2 * k]
        peak = z.max(axis=0)
        np.subtract(z, peak, out=z)
        np.exp(z, out=z)
        return peak, z, z.sum(axis=0)

    def value_and_grad(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        """Summed Huber (or 0.5 * squared) loss of log residuals and its gradient [2K+1]."""
        k = self.num_terms
        peak, expz, total = self._terms(theta)
        resid = self.log_y - peak - np.log(total)
        # psi = Huber'(r); then Huber(r) = psi * (r - psi / 2) in both branches.
        psi = resid if self.delta is None else np.clip(resid, -self.delta, self.delta)
        value = float(psi @ (resid - 0.5 * psi))
        # Softmax weights w = expz / total; d r/d a_k = -w_k, d r/d alpha_k = w_k log x_k,
        # d r/d e = -w_E.
        wpsi = expz * (psi / total)
        grad = np.empty(2 * k + 1)
        grad[:k] = -wpsi[:k].sum(axis=1)
        grad[k : 2 * k] = np.einsum("kn,kn->k", wpsi[:k], self.log_x)
        grad[2 * k] = -wpsi[k].sum()
        return value, grad


@dataclasses.dataclass(frozen=True, kw_only=True)
class FitOptions:
    """How a log-space power law is fitted from many starts and bootstrapped.

    Attributes:
        delta: Huber delta on log residuals (None = least squares).
        num_resamples: bootstrap resamples of the points (0 = none).
        seed: seed of the resample indices.
        workers: processes for the starts and the bootstrap.
        warm_starts: bootstrap refits run BFGS from this many distinct local optima of the
            full-data fit (a full start grid per resample costs its size again; the optima it
            finds are these).
    """

    delta: float | None = HUBER_DELTA
    num_resamples: int = 0
    seed: int = 0
    workers: int = 1
    warm_starts: int = 2

    def bootstrap(self, refit, arrays: list[np.ndarray], names, unit: str) -> BootstrapDraws:
        """`run_bootstrap` of `refit` over the rows of `arrays` with these options."""
        return run_bootstrap(
            refit,
            arrays,
            names,
            num_resamples=self.num_resamples,
            seed=self.seed,
            workers=self.workers,
            unit=unit,
        )


# Epoch's protocol without a bootstrap.
DEFAULT_OPTIONS = FitOptions()


@dataclasses.dataclass(frozen=True)
class MultiStartResult:
    """Best of several L-BFGS-B runs.

    Attributes:
        theta: best parameters [P].
        value: objective at `theta`.
        success: whether the best run reported convergence.
        message: optimiser message of the best run.
        local_optima: [M, P] distinct end points sorted by objective (best first), for warm starts.
        num_starts: number of starts tried.
    """

    theta: np.ndarray
    value: float
    success: bool
    message: str
    local_optima: np.ndarray
    num_starts: int

    def record(self, objective: str, options: FitOptions) -> dict:
        """What a fit's `extra` says of this search: the objective in words, its Huber delta,
        the value reached and the number of starts."""
        return {
            "objective": objective,
            "huber_delta": options.delta,
            "objective_value": self.value,
            "num_starts": self.num_starts,
        }


def minimize_from_starts(
    objective: LogPowerLaw,
    starts: np.ndarray,
    keep_optima: int = 8,
    workers: int = 1,
    method: str = "L-BFGS-B",
) -> MultiStartResult:
    """Run `method` (unbounded, SciPy defaults as in Epoch's notebook) from every row of `starts`.

    The outcome does not depend on `workers`: every start runs the same deterministic optimiser,
    and the end points are merged in start order before the best is chosen. The best end point
    is then polished by BFGS and replaced if that lowers the objective: L-BFGS-B's relative
    reduction test (factr) can stop early on this nearly-L1 objective of size ~1e-3.

    Args:
        objective: the objective to minimise.
        starts: [S, P] starting points.
        keep_optima: how many distinct local optima to keep (for warm-starting bootstrap refits).
        workers: processes to spread the starts over (1 = this process).
    """
    if workers <= 1 or len(starts) < MIN_STARTS_PER_WORKER * workers:
        runs = _run_starts(objective, starts, method)
    else:
        chunks = np.array_split(starts, workers * 4)
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            parts = pool.map(_run_starts, [objective] * len(chunks), chunks, [method] * len(chunks))
            runs = StartRuns.concatenate(list(parts))
    finite = np.flatnonzero(np.isfinite(runs.values) & np.all(np.isfinite(runs.ends), axis=1))
    if len(finite) == 0:
        nan = np.full(starts.shape[1], np.nan)
        return MultiStartResult(
            nan,
            float("nan"),
            False,
            "no start converged to a finite value",
            nan[None],
            len(starts),
        )
    order = finite[np.argsort(runs.values[finite], kind="stable")]
    best = int(order[0])
    theta, value = runs.ends[best], float(runs.values[best])
    success, message = runs.success[best], runs.messages[best]
    polished = _run_starts(objective, theta[None], "BFGS") if method != "BFGS" else None
    if polished is not None and np.isfinite(polished.values[0]) and polished.values[0] < value:
        theta, value = polished.ends[0], float(polished.values[0])
        success, message = polished.success[0] or success, f"{message}; polished by BFGS"
    return MultiStartResult(
        theta=theta,
        value=value,
        success=bool(success),
        message=str(message),
        local_optima=_distinct(np.concatenate([theta[None], runs.ends[order]]), keep_optima),
        num_starts=len(starts),
    )


@dataclasses.dataclass(frozen=True)
class StartRuns:
    """Where the optimiser ended from each start, in start order.

    Attributes:
        ends: [S, P] end points.
        values: [S] objective values there (NaN when not finite).
        success: [S] whether each run reported convergence.
        messages: [S] optimiser messages.
    """

    ends: np.ndarray
    values: np.ndarray
    success: tuple[bool, ...]
    messages: tuple[str, ...]

    @classmethod
    def concatenate(cls, parts: list[StartRuns]) -> StartRuns:
        return cls(
            ends=np.concatenate([p.ends for p in parts]),
            values=np.concatenate([p.values for p in parts]),
            success=tuple(f for p in parts for f in p.success),
            messages=tuple(m for p in parts for m in p.messages),
        )


def _run_starts(objective: LogPowerLaw, starts: np.ndarray, method: str) -> StartRuns:
    """`method` from every row of starts [S, P]."""
    ends = np.full(starts.shape, np.nan)
    values = np.full(len(starts), np.nan)
    flags, messages = [], []
    for i, start in enumerate(starts):
        with (
            single_threaded_blas(),
            np.errstate(over="ignore", invalid="ignore", divide="ignore"),
        ):
            res = minimize(objective.value_and_grad, start, jac=True, method=method)
        ends[i], values[i] = res.x, res.fun
        flags.append(bool(res.success))
        messages.append(str(res.message))
    return StartRuns(ends, values, tuple(flags), tuple(messages))


def _distinct(sorted_points: np.ndarray, keep: int) -> np.ndarray:
    """The first `keep` rows of `sorted_points` that differ from every kept row by > 1e-3 (max)."""
    kept: list[np.ndarray] = []
    for point in sorted_points:
        if all(np.max(np.abs(point - other)) > 1e-3 for other in kept):
            kept.append(point)
        if len(kept) == keep:
            break
    return np.array(kept)


def cartesian_grid(*axes: np.ndarray) -> np.ndarray:
    """All combinations of the given 1-D axes, shape [prod(len), len(axes)], first axis slowest."""
    mesh = np.meshgrid(*axes, indexing="ij")
    return np.stack([m.ravel() for m in mesh], axis=1)
