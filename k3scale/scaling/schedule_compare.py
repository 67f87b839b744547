"""Schedule comparison in one (arch, size, budget) cell (methods.md 3.2, 3.4).

Each schedule is compared at its own tuned optimum and at one shared (lr, batch): the reference
schedule's optimum. A schedule's loss at a point it was not tuned at is read off its quadratic
surface through its trials (and the nearest trial is reported beside it as a data check).
Intervals: bootstrap over trials within each schedule independently.
"""

from __future__ import annotations

import numpy as np

from k3scale.errors import K3ScaleError
from k3scale.scaling.bootstrap import run_bootstrap
from k3scale.scaling.hpopt import predict_quadratic, quadratic_optimum, smoothing_mode

QUANTITIES = (
    "loss_own_ref",
    "loss_own_other",
    "diff_own",
    "loss_shared_other",
    "diff_shared",
    "lr_ratio",
    "batch_ratio",
)


def _tuned(lr, batch, loss) -> dict:
    """Smoothed optimum when the quadratic has an interior minimum, else the best trial."""
    mode = smoothing_mode(lr, batch)
    if mode is not None:
        quad = quadratic_optimum(lr, batch, loss, mode == "2d")
        inside = quad["minimum"] and lr.min() <= quad["lr_opt"] <= lr.max()
        if inside:
            return {**quad, "smoothed": True}
    i = int(np.argmin(loss))
    return {
        "lr_opt": float(lr[i]),
        "batch_opt": float(batch[i]),
        "loss_opt": float(loss[i]),
        "coef": None,
        "smoothed": False,
    }


def _loss_at(tuned: dict, lr, batch, loss, at_lr: float, at_batch: float) -> float:
    if tuned["coef"] is not None:
        return predict_quadratic(tuned["coef"], at_lr, at_batch)
    i = int(np.argmin(np.hypot(np.log(lr / at_lr), np.log(batch / at_batch))))
    return float(loss[i])


def _quantities(lr, batch, loss, code) -> np.ndarray:
    ref = [a[code == 0] for a in (lr, batch, loss)]
    other = [a[code == 1] for a in (lr, batch, loss)]
    t_ref, t_other = _tuned(*ref), _tuned(*other)
    shared = _loss_at(t_other, *other, t_ref["lr_opt"], t_ref["batch_opt"])
    return np.array(
        [
            t_ref["loss_opt"],
            t_other["loss_opt"],
            t_ref["loss_opt"] - t_other["loss_opt"],
            shared,
            t_ref["loss_opt"] - shared,
            t_other["lr_opt"] / t_ref["lr_opt"],
            t_other["batch_opt"] / t_ref["batch_opt"],
        ]
    )


def sign_of(interval: list[float], reference: str, other: str) -> str:
    lo, hi = interval
    if hi < 0:
        return f"{reference} lower"
    if lo > 0:
        return f"{other} lower"
    return "not resolved (interval contains 0)"


def compare_cell(
    trials: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
    reference: str,
    *,
    num_resamples: int = 200,
    seed: int = 0,
) -> dict:
    """Compare every schedule in `trials` with `reference` in one cell.

    Args:
        trials: schedule -> (lr [n], batch [n], final loss [n]) of its finished trials.
        reference: the schedule whose tuned (lr, batch) is the shared setting.
        num_resamples, seed: bootstrap over trials within each schedule.

    Returns:
        {other: {quantity: value, "ci": {quantity: [lo, hi]}, "sign_own", "sign_shared",
                 "nearest_trial_at_shared"}}. diff = L_reference - L_other (negative: reference
        lower). lr_ratio = lr_opt_other / lr_opt_reference.
    """
    if reference not in trials:
        raise K3ScaleError(f"schedule comparison: reference {reference!r} has no trials")
    out = {}
    for other in sorted(set(trials) - {reference}):
        arrays = [np.concatenate([trials[reference][j], trials[other][j]]) for j in range(3)]
        code = np.repeat([0, 1], [len(trials[reference][2]), len(trials[other][2])])
        for name, count in ((reference, int((code == 0).sum())), (other, int((code == 1).sum()))):
            if count < 1:
                raise K3ScaleError(f"schedule comparison: {name!r} has no finished trials")
        point = dict(zip(QUANTITIES, _quantities(*arrays, code), strict=True))
        entry = {**point, "ci": {}}
        if num_resamples > 0:
            draws = run_bootstrap(
                _quantities,
                [*arrays, code],
                QUANTITIES,
                num_resamples=num_resamples,
                seed=seed,
                strata=code,
                unit="trials within each schedule",
            )
            entry["ci"] = draws.intervals()
            entry["sign_own"] = sign_of(entry["ci"]["diff_own"], reference, other)
            entry["sign_shared"] = sign_of(entry["ci"]["diff_shared"], reference, other)
            entry["bootstrap"] = draws.summary()
        t_ref = _tuned(*(a[code == 0] for a in arrays))
        lr_o, b_o, l_o = (a[code == 1] for a in arrays)
        i = int(
            np.argmin(np.hypot(np.log(lr_o / t_ref["lr_opt"]), np.log(b_o / t_ref["batch_opt"])))
        )
        entry["nearest_trial_at_shared"] = {
            "lr": float(lr_o[i]),
            "batch": float(b_o[i]),
            "loss": float(l_o[i]),
        }
        entry["smoothed"] = {
            reference: t_ref["smoothed"],
            other: _tuned(lr_o, b_o, l_o)["smoothed"],
        }
        out[other] = entry
    return out
