"""`FitResult`: the SciPy-like frozen result every fit returns, and deterministic JSON output.

A result names what was fitted (`target`, `units`), carries named parameters, whether the
optimiser succeeded and why not, percentile intervals from the bootstrap, and the number of
points. Floats are rounded to `SIGNIFICANT_DIGITS` significant digits when serialised so that a
rerun on the same table gives byte-identical JSON even if the last bits of a float differ.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

# Ten significant digits: far below any fitted quantity's statistical uncertainty and far above
# the run-to-run jitter of L-BFGS-B in the last few bits of a double.
SIGNIFICANT_DIGITS = 10


@dataclasses.dataclass(frozen=True, kw_only=True)
class FitResult:
    """A fitted model, frozen; `to_dict()` is its JSON form.

    Attributes:
        target: what was fitted, e.g. "final_val_ood_loss(N, D)".
        units: units of every axis and parameter, e.g. {"N": "parameters", "L": "nats/token"}.
        params: named parameter values (floats).
        success: False when the optimiser did not converge or the input could not support the fit.
        message: why, in one line ("" when success is True and there is nothing to add).
        n_points: number of points (runs, cells) that entered the fit.
        intervals: name -> [lo, hi] percentile interval (95% unless `extra["level"]` says else).
        derived: named derived quantities (floats), e.g. compute-optimal exponents.
        extra: anything else JSON-able (options, objective value, per-point flags, bootstrap info).
    """

    target: str
    units: dict[str, str]
    params: dict[str, float]
    success: bool
    message: str
    n_points: int
    intervals: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    derived: dict[str, float] = dataclasses.field(default_factory=dict)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict with floats rounded (see `round_floats`)."""
        return round_floats(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> FitResult:
        """The result `to_dict` wrote."""
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in fields})

    def replace(self, **changes: Any) -> FitResult:
        return dataclasses.replace(self, **changes)


def failed(target: str, units: dict[str, str], message: str, n_points: int) -> FitResult:
    """A result that says the fit could not be made, and why."""
    return FitResult(
        target=target, units=units, params={}, success=False, message=message, n_points=n_points
    )


def round_float(value: float) -> float | str | None:
    """Round to `SIGNIFICANT_DIGITS`; NaN -> None; +-inf -> "inf"/"-inf" (JSON has no inf)."""
    if math.isnan(value):
        return None
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0.0:
        return 0.0
    return float(f"{value:.{SIGNIFICANT_DIGITS - 1}e}")


def round_floats(obj: Any) -> Any:
    """Recursively round floats (also NumPy scalars) and turn tuples into lists."""
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, FitResult):
        return obj.to_dict()
    if hasattr(obj, "to_json"):  # typed results (verdicts, estimates) write their own JSON
        return round_floats(obj.to_json())
    if isinstance(obj, dict):
        return {str(k): round_floats(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [round_floats(v) for v in obj]
    if isinstance(obj, int):
        return obj
    if isinstance(obj, float):
        return round_float(obj)
    if hasattr(obj, "tolist"):
        return round_floats(obj.tolist())
    raise TypeError(f"cannot serialise {type(obj).__name__} to JSON")


def dumps(obj: Any) -> str:
    """Deterministic JSON: floats rounded, keys sorted, fixed separators, trailing newline."""
    return json.dumps(round_floats(obj), sort_keys=True, indent=1, allow_nan=False) + "\n"
