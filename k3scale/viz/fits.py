"""Fit results as the dashboards read them: small frozen dataclasses and a JSON adapter.

`k3scale fit` writes one JSON document per study. The dashboards read these sections from it
(every section optional; a missing one leaves its figure to the run table alone):

    {"frontiers":   [{"arch", "schedule", "compute": "c_6n"|"c_attn", "fit": FitResult dict
                      with params E, A, alpha and extra.compute_range, "band": BAND?}],
     "multipliers": [{"base": "k2", "new": "k3", "schedule", "compute", "band": BAND,
                      "data_range": [C_lo, C_hi],
                      "shared": {"k": float, "interval": [lo, hi], "accepted": bool}?}],
     "hp_laws":     [{"arch", "schedule", "target": "lr"|"batch_tokens", "compute",
                      "fit": FitResult dict with params coef, exponent (y = coef * C^exponent),
                      "band": BAND?}],
     "surfaces":    [{"arch", "schedule", "fit": FitResult dict with params E, A, B, alpha,
                      beta (L = E + A/N^alpha + B/D^beta)}]}

    BAND = {"x": [...], "lo": [...], "hi": [...], "median": [...]?}: percentile band of the
    fitted curve over bootstrap refits, evaluated at x (FLOPs).

It also reads the native outputs of k3scale/scaling directly (see the adapters below):

    {"frontier_comparisons": [{"compute", "group_key": "arch"|"schedule", "fixed": the other
                               dimension's value (e.g. "cosine" when groups are archs),
                               "result": compare_frontiers(...) dict,
                               "bands": {group: BAND}?}],
     "hp_power_laws":        [{"arch", "schedule", "target": "lr"|"lr_opt"|"batch_tokens"|
                               "batch_opt", "compute",
                               "fit": fit_power_law({"C": ...}, ...).to_dict(), "band": BAND?}]}

The artifact `k3scale fit ANALYSIS` writes is translated into these native sections first
(k3scale/viz/fit_artifact.py). FitResult dicts are `k3scale.scaling.result.FitResult.to_dict()`.
Anything malformed is one K3ScaleError naming the section and the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from k3scale.errors import K3ScaleError
from k3scale.scaling.headline import headline_lines
from k3scale.viz.fit_artifact import is_fit_artifact, sections_from_artifact


@dataclass(frozen=True, kw_only=True)
class Band:
    x: tuple[float, ...]
    """Abscissae (FLOPs)."""
    lo: tuple[float, ...]
    """Lower percentile of the curve at each x."""
    hi: tuple[float, ...]
    """Upper percentile of the curve at each x."""
    median: tuple[float, ...] | None = None
    """Median over refits at each x, when given."""


@dataclass(frozen=True, kw_only=True)
class FrontierFit:
    arch: str
    schedule: str
    compute: str
    """Run-table compute column the fit used (c_6n or c_attn)."""
    params: dict[str, float]
    """E (nats/token), A, alpha: L = E + A * C^-alpha, C in FLOPs."""
    intervals: dict[str, list[float]]
    """95% bootstrap intervals per parameter (may be empty)."""
    success: bool
    message: str
    data_range: tuple[float, float]
    """Smallest and largest compute (FLOPs) among the fitted points."""
    band: Band | None = None

    def predict(self, compute) -> np.ndarray:
        c = np.asarray(compute, dtype=np.float64)
        return self.params["E"] + self.params["A"] * c ** -self.params["alpha"]


@dataclass(frozen=True, kw_only=True)
class MultiplierFit:
    base: str
    """Baseline group (an arch, or a schedule)."""
    new: str
    """Group compared with the baseline."""
    fixed: str
    """What both groups share: the schedule when groups are archs, the arch when schedules."""
    compute: str
    band: Band
    """M(C) = C_base(L_new(C)) / C (methods.md 2.6) over compute; median may be None."""
    data_range: tuple[float, float]
    """Compute range (FLOPs) covered by both architectures' data."""
    shared_k: float | None = None
    """Multiplier of the shared-exponent joint model L = E + A (k C)^-a, when fitted."""
    shared_k_interval: tuple[float, float] | None = None
    shared_accepted: bool | None = None
    """Whether the shared model survived the test against the free one."""
    not_identified: tuple[str, ...] = ()
    """Verdicts of the compute values left out of `band` (not identified, with the reason)."""


@dataclass(frozen=True, kw_only=True)
class HPLaw:
    arch: str
    schedule: str
    target: str
    """'lr' (peak LR) or 'batch_tokens' (tokens/step)."""
    compute: str
    coef: float
    exponent: float
    """y = coef * C^exponent with C in FLOPs."""
    exponent_interval: tuple[float, float] | None = None
    band: Band | None = None

    def predict(self, compute) -> np.ndarray:
        return self.coef * np.asarray(compute, dtype=np.float64) ** self.exponent


@dataclass(frozen=True, kw_only=True)
class SurfaceFit:
    arch: str
    schedule: str
    params: dict[str, float]
    """E, A, B, alpha, beta of L = E + A/N^alpha + B/D^beta (N active params, D tokens)."""

    def predict(self, n, d) -> np.ndarray:
        p = self.params
        n, d = np.asarray(n, np.float64), np.asarray(d, np.float64)
        return p["E"] + p["A"] / n ** p["alpha"] + p["B"] / d ** p["beta"]


@dataclass(frozen=True, kw_only=True)
class DashboardFits:
    frontiers: tuple[FrontierFit, ...] = ()
    multipliers: tuple[MultiplierFit, ...] = ()
    hp_laws: tuple[HPLaw, ...] = ()
    surfaces: tuple[SurfaceFit, ...] = ()
    source: str = ""
    """Where the fits came from (file name and hash), for the page header."""
    notes: tuple[str, ...] = ()
    """Fits the fit file says it skipped, and why (shown in the page header)."""
    headline: tuple[str, ...] = ()
    """The fit artifact's headline numbers with their verdicts (shown in the page header)."""

    def frontier(self, arch: str, schedule: str, compute: str) -> FrontierFit | None:
        return _first(self.frontiers, arch=arch, schedule=schedule, compute=compute)

    def hp_law(self, arch: str, schedule: str, target: str, compute: str) -> HPLaw | None:
        return _first(self.hp_laws, arch=arch, schedule=schedule, target=target, compute=compute)

    def surface(self, arch: str, schedule: str) -> SurfaceFit | None:
        return _first(self.surfaces, arch=arch, schedule=schedule)


def _first(items, **match):
    for item in items:
        if all(getattr(item, k) == v for k, v in match.items()):
            return item
    return None


def _get(entry: dict, key: str, where: str):
    if not isinstance(entry, dict) or key not in entry:
        raise K3ScaleError(f"fit JSON: {where} has no field {key!r}")
    return entry[key]


def _float(value, where: str) -> float:
    if value in ("inf", "-inf"):
        return float(value)
    if value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        raise K3ScaleError(f"fit JSON: {where} must be a number, got {value!r}") from None


def _floats(values, where: str) -> tuple[float, ...]:
    if not isinstance(values, list):
        raise K3ScaleError(f"fit JSON: {where} must be a list of numbers")
    return tuple(_float(v, where) for v in values)


def _band(entry: dict | None, where: str) -> Band | None:
    if entry is None:
        return None
    x = _floats(_get(entry, "x", where), f"{where}.x")
    lo = _floats(_get(entry, "lo", where), f"{where}.lo")
    hi = _floats(_get(entry, "hi", where), f"{where}.hi")
    median = entry.get("median")
    median = _floats(median, f"{where}.median") if median is not None else None
    if not len(x) == len(lo) == len(hi) or (median is not None and len(median) != len(x)):
        raise K3ScaleError(f"fit JSON: {where} arrays differ in length")
    return Band(x=x, lo=lo, hi=hi, median=median)


def _params(fit: dict, names: tuple[str, ...], where: str) -> dict[str, float]:
    params = _get(fit, "params", where)
    return {n: _float(_get(params, n, f"{where}.params"), f"{where}.params.{n}") for n in names}


def _frontier(entry: dict, where: str) -> FrontierFit:
    fit = _get(entry, "fit", where)
    span = fit.get("extra", {}).get("compute_range")
    if span is None:
        raise K3ScaleError(f"fit JSON: {where}.fit.extra has no field 'compute_range'")
    return FrontierFit(
        arch=_get(entry, "arch", where),
        schedule=_get(entry, "schedule", where),
        compute=entry.get("compute", "c_6n"),
        params=_params(fit, ("E", "A", "alpha"), f"{where}.fit"),
        intervals={k: list(_floats(v, k)) for k, v in fit.get("intervals", {}).items()},
        success=bool(fit.get("success", False)),
        message=str(fit.get("message", "")),
        data_range=tuple(_floats(span, f"{where}.fit.extra.compute_range")),
        band=_band(entry.get("band"), f"{where}.band"),
    )


def _multiplier(entry: dict, where: str) -> MultiplierFit:
    shared = entry.get("shared") or {}
    interval = shared.get("interval")
    return MultiplierFit(
        base=_get(entry, "base", where),
        new=_get(entry, "new", where),
        fixed=_get(entry, "fixed", where),
        compute=entry.get("compute", "c_6n"),
        band=_band(_get(entry, "band", where), f"{where}.band"),
        data_range=tuple(_floats(_get(entry, "data_range", where), f"{where}.data_range")),
        shared_k=_float(shared["k"], f"{where}.shared.k") if "k" in shared else None,
        shared_k_interval=tuple(_floats(interval, f"{where}.shared.interval"))
        if interval
        else None,
        shared_accepted=shared.get("accepted"),
    )


def _hp_law(entry: dict, where: str) -> HPLaw:
    fit = _get(entry, "fit", where)
    params = _params(fit, ("coef", "exponent"), f"{where}.fit")
    interval = fit.get("intervals", {}).get("exponent")
    target = _get(entry, "target", where)
    if target not in ("lr", "batch_tokens"):
        raise K3ScaleError(f"fit JSON: {where}.target must be 'lr' or 'batch_tokens'")
    return HPLaw(
        arch=_get(entry, "arch", where),
        schedule=_get(entry, "schedule", where),
        target=target,
        compute=entry.get("compute", "c_6n"),
        coef=params["coef"],
        exponent=params["exponent"],
        exponent_interval=tuple(_floats(interval, f"{where}.exponent")) if interval else None,
        band=_band(entry.get("band"), f"{where}.band"),
    )


def _surface(entry: dict, where: str) -> SurfaceFit:
    fit = _get(entry, "fit", where)
    names = ("E", "A", "B", "alpha", "beta")
    return SurfaceFit(
        arch=_get(entry, "arch", where),
        schedule=_get(entry, "schedule", where),
        params=_params(fit, names, f"{where}.fit"),
    )


def frontiers_from_comparison(entry: dict, where: str) -> tuple[list, list]:
    """FrontierFits and a MultiplierFit from `k3scale.scaling.frontier_compare.compare_frontiers`.

    M(C) is drawn from its entries at the comparison's `at` compute values (ask for a dense
    grid, e.g. 25 log-spaced values, to get a smooth band); intervals from its bootstrap.
    """
    result = _get(entry, "result", where)
    fixed = _get(entry, "fixed", where)
    by_arch = entry.get("group_key", "arch") == "arch"
    compute = entry.get("compute", "c_6n")
    span = tuple(_floats(_get(result, "data_compute_range", where), f"{where}.data_range"))
    baseline = _get(result, "baseline", where)
    bands = entry.get("bands") or {}
    frontiers = []
    for name, group in _get(result, "groups", where).items():
        gw = f"{where}.groups.{name}"
        frontiers.append(
            FrontierFit(
                arch=name if by_arch else fixed,
                schedule=fixed if by_arch else name,
                compute=compute,
                params={p: _float(_get(group, p, gw), f"{gw}.{p}") for p in ("E", "A", "alpha")},
                intervals={k: list(_floats(v, k)) for k, v in (group.get("ci") or {}).items()},
                success=bool(group.get("success", False)),
                message=str(group.get("message", "")),
                data_range=span,
                band=_band(bands.get(name), f"{where}.bands.{name}"),
            )
        )
    multipliers = []
    shared = result.get("shared_exponent") or {}
    for name in sorted({m["group"] for m in result.get("multiplier", [])}):
        rows = sorted(
            (m for m in result["multiplier"] if m["group"] == name), key=lambda m: m["compute"]
        )
        # Only identified points are drawn: a not-identified M(C) is a verdict (in the headline
        # and in place of the figure), never a band spanning dozens of decades.
        left_out = tuple(
            f"C = {m['compute']:.3g}: {m['verdict']}"
            for m in rows
            if m.get("verdict", "identified") != "identified"
        )
        rows = [m for m in rows if m.get("verdict", "identified") == "identified"]
        ci = [m.get("ci") or [math.nan, math.nan] for m in rows]
        shared_k = shared.get("multiplier")
        multipliers.append(
            MultiplierFit(
                base=baseline,
                new=name,
                fixed=fixed,
                compute=compute,
                band=Band(
                    x=tuple(_float(m["compute"], where) for m in rows),
                    lo=tuple(_float(c[0], where) for c in ci),
                    hi=tuple(_float(c[1], where) for c in ci),
                    median=tuple(_float(m["value"], where) for m in rows),
                ),
                data_range=span,
                shared_k=_float(shared_k, f"{where}.shared") if shared_k is not None else None,
                shared_k_interval=tuple(shared["ci"]) if shared.get("ci") else None,
                shared_accepted=None if shared.get("rejected") is None else not shared["rejected"],
                not_identified=left_out,
            )
        )
    return frontiers, multipliers


# k3scale/scaling/study.py names per-cell optima lr_opt and batch_opt (tokens per step).
_HP_TARGETS = {
    "lr": "lr",
    "lr_opt": "lr",
    "batch_tokens": "batch_tokens",
    "batch_opt": "batch_tokens",
}


def hp_law_from_power_law(entry: dict, where: str) -> HPLaw:
    """HPLaw from `k3scale.scaling.powerlaw.fit_power_law({"C": compute}, optimum)` output."""
    fit = _get(entry, "fit", where)
    params = _params(fit, ("k", "exp_C"), f"{where}.fit")
    interval = fit.get("intervals", {}).get("exp_C")
    target = _HP_TARGETS.get(_get(entry, "target", where))
    if target is None:
        raise K3ScaleError(f"fit JSON: {where}.target must be one of {', '.join(_HP_TARGETS)}")
    return HPLaw(
        arch=_get(entry, "arch", where),
        schedule=_get(entry, "schedule", where),
        target=target,
        compute=entry.get("compute", "c_6n"),
        coef=params["k"],
        exponent=params["exp_C"],
        exponent_interval=tuple(_floats(interval, f"{where}.exp_C")) if interval else None,
        band=_band(entry.get("band"), f"{where}.band"),
    )


_SECTIONS = {
    "frontiers": _frontier,
    "multipliers": _multiplier,
    "hp_laws": _hp_law,
    "surfaces": _surface,
}


def fits_from_json(document: dict, source: str = "") -> DashboardFits:
    """Parse a `k3scale fit` artifact or a document of the sections in the module docstring."""
    if not isinstance(document, dict):
        raise K3ScaleError("fit JSON: the document must be an object with fit sections")
    notes: list[str] = []
    headline: list[str] = []
    if is_fit_artifact(document):
        headline = headline_lines(document)
        document, notes = sections_from_artifact(document)
    parsed = {}
    for section, parse in _SECTIONS.items():
        entries = document.get(section, [])
        if not isinstance(entries, list):
            raise K3ScaleError(f"fit JSON: {section} must be a list")
        parsed[section] = [parse(e, f"{section}[{i}]") for i, e in enumerate(entries)]
    for i, entry in enumerate(document.get("frontier_comparisons", [])):
        frontiers, multipliers = frontiers_from_comparison(entry, f"frontier_comparisons[{i}]")
        parsed["frontiers"] += frontiers
        parsed["multipliers"] += multipliers
    for i, entry in enumerate(document.get("hp_power_laws", [])):
        parsed["hp_laws"].append(hp_law_from_power_law(entry, f"hp_power_laws[{i}]"))
    return DashboardFits(
        **{k: tuple(v) for k, v in parsed.items()},
        source=source,
        notes=tuple(notes),
        headline=tuple(headline),
    )
