"""What the dashboards draw from a `k3scale fit` artifact: its records, as the report reads them.

The schema is k3scale/scaling/values/fitdoc.py's (issue 32: one estimator per number, one reader per
record); `DashboardFits` only holds those records with lookups by arch, schedule and convention,
and the page header's fields. Nothing here fits or re-reads a verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from k3scale.errors import K3ScaleError
from k3scale.scaling import component_text
from k3scale.scaling.answers import answer_lines
from k3scale.scaling.headline import headline_lines
from k3scale.scaling.values import fitdoc
from k3scale.scaling.values.components import ComponentEffects
from k3scale.scaling.values.fitdoc import (
    CellOptimumRecord,
    Comparison,
    ScheduleComparison,
    SkippedFit,
    SurfaceRecord,
)
from k3scale.scaling.values.result import FitResult

# The HP law a figure draws: the form in compute; the (N, D) form has no single axis to draw on.
HP_FORM = "C"


@dataclass(frozen=True, kw_only=True)
class DashboardFits:
    """Everything the figures read from one fit artifact (empty without a fit file)."""

    analysis: str = ""
    """Recipe that wrote the artifact (k2_vs_k3, cosine_vs_wsd)."""
    loss: str = ""
    """Loss column the artifact was fitted on."""
    cell_optima: tuple[CellOptimumRecord, ...] = ()
    comparisons: dict[str, Comparison] = field(default_factory=dict)
    """`compute_optimal` by FLOP convention: frontiers by route and M(C)."""
    component_effects: dict[str, ComponentEffects] = field(default_factory=dict)
    """An ablation's `component_effects` by FLOP convention."""
    schedule_comparison: ScheduleComparison | None = None
    isoflop: dict[tuple[str, str], FitResult | SkippedFit] = field(default_factory=dict)
    """(arch, conv) -> `per_arch.<arch>.isoflop.<conv>`."""
    hp_laws: dict[tuple[str, str, str], FitResult | SkippedFit] = field(default_factory=dict)
    """(schedule, conv, target) -> the law in compute, or why there is none."""
    source: str = ""
    """Where the fits came from (file name and hash), for the page header."""
    notes: tuple[str, ...] = ()
    """Skipped fits no figure names, and why (shown in the page header)."""
    answers: tuple[str, ...] = ()
    """One line per claim with its interval and verdict (the report's ANSWER lines)."""
    headline: tuple[str, ...] = ()
    """Every number of the artifact with its verdict, as the report prints them."""

    @classmethod
    def from_artifact(cls, document: dict, source: str = "") -> DashboardFits:
        """The records of a `k3scale fit` artifact, read by fitdoc's readers.

        Raises:
            K3ScaleError: not an artifact, one of another schema version, or a malformed one.
        """
        if not isinstance(document, dict) or not {"provenance", "results"} <= set(document):
            raise K3ScaleError(
                "fit file: not a `k3scale fit` artifact (an object with provenance and results)"
            )
        version = (document["provenance"] or {}).get("artifact_version")
        if version != fitdoc.SCHEMA_VERSION:
            raise K3ScaleError(
                f"fit file: artifact version {version}, this k3scale reads version "
                f"{fitdoc.SCHEMA_VERSION}; rerun `k3scale fit {document.get('analysis', '')}`"
            )
        try:
            return cls._read(document, source)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise K3ScaleError(
                f"fit file: malformed artifact ({type(exc).__name__}: {exc})"
            ) from None

    @classmethod
    def _read(cls, document: dict, source: str) -> DashboardFits:
        results = document["results"]
        hp_laws = fitdoc.read_hp_laws(results, HP_FORM)
        options = document["provenance"].get("options") or {}
        return cls(
            analysis=str(document.get("analysis", "")),
            loss=str(options.get("loss", "")),
            cell_optima=tuple(fitdoc.read_cell_optima(results)),
            comparisons=fitdoc.read_comparisons(results),
            component_effects=component_text.read(results),
            schedule_comparison=fitdoc.read_schedule_comparison(results),
            isoflop=fitdoc.read_isoflop(results),
            hp_laws=hp_laws,
            source=source,
            notes=_skipped_law_notes(hp_laws),
            answers=tuple(answer_lines(document)),
            headline=tuple(headline_lines(document)),
        )

    def optima(self, **match) -> list[CellOptimumRecord]:
        """Cell optima whose cell has every field of `match` (e.g. arch="k3")."""
        return [o for o in self.cell_optima if all(o.cell[k] == v for k, v in match.items())]

    def multipliers(self) -> list[tuple[str, str, str]]:
        """(conv, baseline, new) of every M(C) the artifact holds."""
        return [
            (conv, comparison.baseline, new)
            for conv, comparison in self.comparisons.items()
            for new in comparison.others
        ]

    def isoflop_fit(self, arch: str, conv: str) -> FitResult | SkippedFit | None:
        return self.isoflop.get((arch, conv))

    def hp_law(self, schedule: str, target: str, conv: str) -> FitResult | None:
        """The fitted law y = k C^exp_C of `target` (lr_opt, batch_opt), None if not fitted."""
        fit = self.hp_laws.get((schedule, conv, target))
        return fit if isinstance(fit, FitResult) else None

    def surface(self, arms: tuple[str, ...]) -> tuple[SurfaceRecord | None, str]:
        """(surface of the first of `arms` the c_6n surface route has, or None; why not).

        The route's arms are archs or schedules, so a figure of one (arch, schedule) passes both.
        """
        comparison = self.comparisons.get("c_6n")
        if comparison is None:
            return None, "the fit file has no compute-optimal section (c_6n)"
        if comparison.skipped:
            return (
                None,
                f"compute-optimal fits (c_6n) skipped by `k3scale fit`: {comparison.skipped}",
            )
        route = comparison.routes.get("surface")
        if route is None or route.skipped:
            why = route.skipped if route else "not computed"
            return None, f"surface route (c_6n) skipped by `k3scale fit`: {why}"
        for arm in arms:
            found = route.arms.get(arm)
            if found is not None and found.surface is not None:
                return found.surface, ""
        return None, f"the surface route (c_6n) has no arm {' or '.join(arms)}"


def _skipped_law_notes(hp_laws: dict) -> tuple[str, ...]:
    """One note per (schedule, conv, reason): 'lr_opt and batch_opt laws of wsd (c_6n) skipped'."""
    targets: dict[tuple[str, str, str], list[str]] = {}
    for (schedule, conv, target), fit in hp_laws.items():
        if isinstance(fit, SkippedFit):
            targets.setdefault((schedule, conv, fit.reason), []).append(target)
    return tuple(
        f"{' and '.join(names)} law{'s' if len(names) > 1 else ''} of {schedule} ({conv}) "
        f"skipped: {reason}"
        for (schedule, conv, reason), names in targets.items()
    )


def table_hash_of(document: dict) -> str | None:
    """The run-table hash the artifact was fitted on, if it records one."""
    return (document.get("provenance") or {}).get("table_hash")
