"""Input checks shared by every fit: one clear K3ScaleError naming the field, never silent garbage."""

from __future__ import annotations

import numpy as np

from k3scale.errors import K3ScaleError


def positive_finite(name: str, values, step: str = "fit") -> np.ndarray:
    """Return `values` as a float64 array after checking every entry is finite and > 0.

    Raises:
        K3ScaleError: naming `name`, the count of bad entries and the first bad index.
    """
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise K3ScaleError(f"{step}: {name} must be one-dimensional, got shape {arr.shape}")
    bad = ~np.isfinite(arr) | (arr <= 0)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise K3ScaleError(
            f"{step}: {name} must be finite and positive; {int(bad.sum())} bad value(s), first "
            f"at row {first} ({float(arr[first])!r}); drop or fix those rows"
        )
    return arr


def enough_points(num_points: int, num_params: int, what: str, step: str = "fit") -> None:
    """Raise unless there are more points than free parameters."""
    if num_points <= num_params:
        raise K3ScaleError(
            f"{step}: {what} needs more points than its {num_params} parameters, got {num_points}"
        )


def same_length(step: str = "fit", **arrays: np.ndarray) -> None:
    """Raise unless all named arrays have the same length."""
    lengths = {name: len(arr) for name, arr in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise K3ScaleError(f"{step}: columns differ in length: {lengths}")


def surface_design_reason(n, d) -> str | None:
    """Why points at (N [k], D [k]) cannot identify L = E + A N^-alpha + B D^-beta, or None.

    Five parameters need more than five distinct (N, D) points, and each power term needs three
    distinct values of its input: with two, its coefficient, exponent and E trade off freely.
    """
    distinct = len({(float(a), float(b)) for a, b in zip(n, d, strict=True)})
    if distinct <= 5:
        return f"{distinct} distinct (N, D) points (a surface needs more than its 5 parameters)"
    for name, values in (("N", n), ("D", d)):
        count = len(np.unique(values))
        if count < 3:
            return f"{count} distinct {name} values (the {name} term needs >= 3)"
    return None


def budgets_per_size_reason(n, d, minimum: int) -> str | None:
    """Why points at (N [k], D [k]) hold fewer than `minimum` token budgets at some size, or None."""
    sizes = np.unique(n)
    counts = [len(np.unique(np.asarray(d)[np.asarray(n) == size])) for size in sizes]
    if min(counts) >= minimum:
        return None
    return (
        f"{min(counts)} token budgets at a size (tokens-per-parameter ratios; the surface route "
        f"needs >= {minimum} at every size)"
    )
