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
