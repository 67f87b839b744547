"""Per-cell hyper-parameter optimum: best trial and a smoothed optimum (methods.md 4.2, 3.2).

The argmin of individual trials is noisy on a broad plateau, so a quadratic in u = log lr (and
v = log batch when at least 3 batch sizes were tried, `smoothing_mode`) is fitted through the
trials by least squares and its stationary point is the smoothed optimum; its curvature is the kappa of
methods.md 3.2. Optima on the edge of the searched range are flagged, never silently kept.
"""

from __future__ import annotations

import functools

import numpy as np

from k3scale.scaling import checks
from k3scale.scaling.bootstrap import run_bootstrap
from k3scale.scaling.result import FitResult

NAMES = ("lr_opt", "batch_opt", "loss_opt")
UNITS = {"lr": "peak learning rate", "batch": "tokens per step", "loss": "nats/token"}


def _design(u: np.ndarray, v: np.ndarray | None) -> np.ndarray:
    if v is None:
        return np.column_stack([np.ones_like(u), u, u * u])
    return np.column_stack([np.ones_like(u), u, v, u * u, u * v, v * v])


def quadratic_optimum(lr: np.ndarray, batch: np.ndarray, loss: np.ndarray, two_d: bool) -> dict:
    """Stationary point of the least-squares quadratic in (log lr[, log batch]).

    Returns:
        {"lr_opt", "batch_opt", "loss_opt", "minimum" (Hessian positive definite),
         "coef" (quadratic coefficients), "curvature_lr" (d^2 L / d (log lr)^2)}.
        In 1-D mode batch_opt is the median batch of the trials.
    """
    u = np.log(lr)
    v = np.log(batch) if two_d else None
    coef, *_ = np.linalg.lstsq(_design(u, v), loss, rcond=None)
    if two_d:
        hess = np.array([[2 * coef[3], coef[4]], [coef[4], 2 * coef[5]]])
        minimum = bool(np.all(np.linalg.eigvalsh(hess) > 0))
        point = np.linalg.solve(hess, -coef[1:3]) if minimum else np.full(2, np.nan)
        loss_opt = (_design(point[:1], point[1:]) @ coef)[0] if minimum else np.nan
        u_opt, batch_opt, curvature = point[0], np.exp(point[1]), 2 * coef[3]
    else:
        minimum = bool(coef[2] > 0)
        u_opt = -coef[1] / (2 * coef[2]) if minimum else np.nan
        loss_opt = coef[0] + coef[1] * u_opt + coef[2] * u_opt**2 if minimum else np.nan
        batch_opt, curvature = float(np.median(batch)), 2 * coef[2]
    return {
        "lr_opt": float(np.exp(u_opt)),
        "batch_opt": float(batch_opt),
        "loss_opt": float(loss_opt),
        "minimum": minimum,
        "coef": coef.tolist(),
        "curvature_lr": float(curvature),
    }


def smoothing_mode(lr: np.ndarray, batch: np.ndarray) -> str | None:
    """Which quadratic the trials support: "2d" (>= 3 batch sizes and >= 7 trials), "1d" (one
    batch size, >= 3 learning rates and >= 4 trials), or None (report the best trial).

    Trials at several batch sizes but too few for 2-D get no quadratic: a 1-D fit in log lr
    would treat the batch effect as noise, and its minimum then undercut every observed trial
    (by 0.16 nats in the first cpu-preset study).
    """
    num_batches, num = len(np.unique(batch)), len(lr)
    if len(np.unique(lr)) < 3:
        return None
    if num_batches >= 3 and num >= 7:
        return "2d"
    if num_batches == 1 and num >= 4:
        return "1d"
    return None


def predict_quadratic(coef, lr: float, batch: float) -> float:
    """Loss of a fitted quadratic (1-D when it has 3 coefficients) at (lr, batch)."""
    u = np.array([np.log(lr)])
    v = np.array([np.log(batch)]) if len(coef) == 6 else None
    return float((_design(u, v) @ np.asarray(coef))[0])


def _refit(lr, batch, loss, *, two_d: bool) -> np.ndarray:
    if len(np.unique(lr)) < 3 or (two_d and len(np.unique(batch)) < 3):
        return np.full(3, np.nan)
    fit = quadratic_optimum(lr, batch, loss, two_d)
    return np.array([fit[n] for n in NAMES]) if fit["minimum"] else np.full(3, np.nan)


def cell_optimum(
    lr,
    batch,
    loss,
    *,
    run_ids=None,
    num_resamples: int = 200,
    seed: int = 0,
    target: str = "final loss(lr, batch)",
    units: dict[str, str] | None = None,
) -> FitResult:
    """Best trial and smoothed (quadratic) optimum of one (arch, size, budget, schedule) cell.

    Args:
        lr: [n] peak learning rates of the finished trials.
        batch: [n] batch sizes (state the unit in `units`, default tokens per step).
        loss: [n] final losses (finished trials only; pass diverged trials separately).
        run_ids: optional [n] ids, to name the best trial.
        num_resamples, seed: bootstrap over trials for the smoothed optimum's intervals.

    Returns:
        FitResult: params lr_opt, batch_opt, loss_opt (smoothed when it is an interior minimum,
        else the best trial, with success False and the reason); extra has "best_trial",
        "edge" flags, "mode" ("2d" | "1d"), the quadratic and "curvature_lr".
    """
    lr = checks.positive_finite("lr", lr, "cell optimum")
    batch = checks.positive_finite("batch", batch, "cell optimum")
    loss = checks.positive_finite("loss", loss, "cell optimum")
    checks.same_length("cell optimum", lr=lr, batch=batch, loss=loss)
    units = units or UNITS
    i_best = int(np.argmin(loss))
    best = {"lr": float(lr[i_best]), "batch": float(batch[i_best]), "loss": float(loss[i_best])}
    if run_ids is not None:
        best["run_id"] = str(list(run_ids)[i_best])
    edge = {
        "best_lr_on_edge": bool(lr[i_best] in (lr.min(), lr.max())),
        "best_batch_on_edge": bool(
            len(np.unique(batch)) > 1 and batch[i_best] in (batch.min(), batch.max())
        ),
    }
    mode = smoothing_mode(lr, batch)
    two_d = mode == "2d"
    extra = {
        "best_trial": best,
        "edge": edge,
        "mode": mode or "best trial",
        "searched": {
            "lr": [float(lr.min()), float(lr.max())],
            "batch": [float(batch.min()), float(batch.max())],
        },
    }
    if mode is None:
        return FitResult(
            target=target,
            units=units,
            params={"lr_opt": best["lr"], "batch_opt": best["batch"], "loss_opt": best["loss"]},
            success=False,
            message="too few trials for a quadratic in (log lr, log batch) (2-D: >= 3 batch "
            "sizes and >= 7 trials; 1-D: one batch size, >= 4 trials); best trial reported",
            n_points=len(loss),
            extra=extra,
        )
    quad = quadratic_optimum(lr, batch, loss, two_d)
    extra.update({"quadratic": quad["coef"], "curvature_lr": quad["curvature_lr"]})
    inside = (
        quad["minimum"]
        and lr.min() <= quad["lr_opt"] <= lr.max()
        and (not two_d or batch.min() <= quad["batch_opt"] <= batch.max())
    )
    edge["smoothed_outside_range"] = not inside
    if not inside:
        return FitResult(
            target=target,
            units=units,
            params={"lr_opt": best["lr"], "batch_opt": best["batch"], "loss_opt": best["loss"]},
            success=False,
            message="quadratic has no minimum inside the searched range (optimum on "
            "the edge); best trial reported, widen the search",
            n_points=len(loss),
            extra=extra,
        )
    result = FitResult(
        target=target,
        units=units,
        params={n: quad[n] for n in NAMES},
        success=True,
        message="",
        n_points=len(loss),
        extra=extra,
    )
    if num_resamples <= 0:
        return result
    draws = run_bootstrap(
        functools.partial(_refit, two_d=two_d),
        [lr, batch, loss],
        NAMES,
        num_resamples=num_resamples,
        seed=seed,
        unit="trials",
    )
    return result.replace(
        intervals=draws.intervals(), extra={**result.extra, "bootstrap": draws.summary()}
    )
