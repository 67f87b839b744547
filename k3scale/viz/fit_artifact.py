"""Read the artifact `k3scale fit ANALYSIS` writes (k3scale/commands/fit.py) for the dashboards.

The artifact is `{"analysis", "provenance": {"table_hash", ...}, "results": {...}}` where the
recipes in analysis/ fill `results` from k3scale/scaling/study.py: `frontiers` (per FLOP
convention, a `compare_frontiers` result grouped by arch or by schedule), `per_arch[arch].surface`
and `per_schedule[schedule].hp_laws[convention][lr_opt|batch_opt]` (FitResult dicts), and
`{"skipped": why}` wherever the data could not support a fit. This module turns it into the
native sections `fits_from_json` reads (k3scale/viz/fits.py).
"""

from __future__ import annotations

from k3scale.errors import K3ScaleError


def is_fit_artifact(document: dict) -> bool:
    return isinstance(document, dict) and "results" in document and "provenance" in document


def _cells(results: dict) -> tuple[list[str], list[str]]:
    cells = [o.get("cell", {}) for o in results.get("cell_optima", [])]
    archs = sorted({c["arch"] for c in cells if "arch" in c})
    schedules = sorted({c["schedule"] for c in cells if "schedule" in c})
    if not archs or not schedules:
        raise K3ScaleError("fit artifact: results.cell_optima names no arch or schedule")
    return archs, schedules


def _frontier_sections(results: dict, archs: list[str], schedules: list[str], notes: list):
    out = []
    for conv, comp in sorted(results.get("frontiers", {}).items()):
        if "skipped" in comp:
            notes.append(f"frontier fit ({conv}) skipped by `k3scale fit`: {comp['skipped']}")
            continue
        by_arch = set(comp.get("groups", {})) <= set(archs)
        out.append(
            {
                "compute": conv,
                "group_key": "arch" if by_arch else "schedule",
                "fixed": "+".join(schedules if by_arch else archs),
                "result": comp,
                "bands": comp.get("bands"),
            }
        )
    return out


def _surface_sections(results: dict, schedules: list[str], notes: list):
    out = []
    for arch, part in sorted(results.get("per_arch", {}).items()):
        fit = part.get("surface", {})
        if "skipped" in fit:
            notes.append(f"surface fit of {arch} skipped by `k3scale fit`: {fit['skipped']}")
        elif "params" in fit:
            out.append({"arch": arch, "schedule": "+".join(schedules), "fit": fit})
    return out


def _hp_sections(results: dict, archs: list[str], notes: list):
    out = []
    for schedule, part in sorted(results.get("per_schedule", {}).items()):
        for conv, laws in sorted(part.get("hp_laws", {}).items()):
            if "skipped" in laws:
                notes.append(f"HP laws of {schedule} ({conv}) skipped: {laws['skipped']}")
                continue
            for target, fit in sorted(laws.items()):
                if "skipped" in fit:
                    notes.append(f"{target} law of {schedule} ({conv}) skipped: {fit['skipped']}")
                elif "params" in fit:
                    out.append(
                        {
                            "arch": "+".join(archs),
                            "schedule": schedule,
                            "target": target,
                            "compute": conv,
                            "fit": fit,
                        }
                    )
    return out


def sections_from_artifact(document: dict) -> tuple[dict, list[str]]:
    """(native-sections document, notes on fits the artifact skipped)."""
    results = document.get("results")
    if not isinstance(results, dict):
        raise K3ScaleError("fit artifact: 'results' must be an object")
    archs, schedules = _cells(results)
    notes: list[str] = []
    sections = {
        "frontier_comparisons": _frontier_sections(results, archs, schedules, notes),
        "surfaces": _surface_sections(results, schedules, notes),
        "hp_power_laws": _hp_sections(results, archs, notes),
    }
    return sections, notes


def artifact_table_hash(document: dict) -> str | None:
    """The run-table hash the artifact was fitted on, if it records one."""
    return (document.get("provenance") or {}).get("table_hash")
