"""The headline numbers of a fit artifact, as lines of text (no fitting here, only reading).

cosine_vs_wsd: per (size, budget) cell, cosine minus WSD final loss at each schedule's own tuned
optimum and at the shared (LR, batch), with bootstrap intervals and the sign they support.
k2_vs_k3: the K3-over-K2 compute multiplier M(C) at the stated compute values and, where a
shared exponent is not rejected, the single multiplier; under both FLOP conventions.
"""

from __future__ import annotations

from typing import Any


def headline_lines(doc: dict[str, Any]) -> list[str]:
    """Human-readable headline of a `k3scale fit` JSON document."""
    results = doc.get("results", {})
    lines: list[str] = []
    if "schedule_comparison" in results:
        lines += _schedule_lines(results["schedule_comparison"])
    if "frontiers" in results:
        lines += _multiplier_lines(results["frontiers"])
    return lines or ["no headline quantity in this fit"]


def _interval(ci: list[float | None] | None, spec: str = "+.4f") -> str:
    if not ci:
        return "[no interval]"
    return f"[{_number(ci[0], spec)}, {_number(ci[1], spec)}]"


def _number(value: float | None, spec: str) -> str:
    """`value` in `spec`; fits write NaN (undefined) as JSON null."""
    return "undefined" if value is None else format(value, spec)


def _schedule_lines(comparison: dict) -> list[str]:
    reference = comparison.get("reference", "cosine")
    lines = [f"{reference} minus other schedule, final loss (nats/token), 95% bootstrap intervals:"]
    for cell in comparison.get("cells", []):
        where = f"{cell['cell']['size']} D={cell['cell']['budget_tokens']:,}"
        for other, entry in cell["comparison"].items():
            ci = entry.get("ci", {})
            lines.append(
                f"  {where}: at own tuned optima {entry['diff_own']:+.4f} "
                f"{_interval(ci.get('diff_own'))} ({entry.get('sign_own', 'no bootstrap')}); "
                f"at {reference}'s optimum for both {entry['diff_shared']:+.4f} "
                f"{_interval(ci.get('diff_shared'))} ({entry.get('sign_shared', 'no bootstrap')}); "
                f"lr_opt {other}/{reference} = {entry['lr_ratio']:.2f}"
            )
    if not comparison.get("cells"):
        lines.append("  (no cell has finished trials of both schedules)")
    return lines + _measured_lines(comparison, reference)


MEASURED_READINGS = {
    "best_trials": "best trials",
    "seed_reruns": "seed re-runs at own optima",
    "shared_arm": "shared arm (other run at {ref}'s best point)",
}


def _measured_lines(comparison: dict, reference: str) -> list[str]:
    noise = comparison.get("run_noise") or {}
    if not noise:
        return []
    sd = noise.get("sd")
    lines = [
        f"measured runs only, {reference} minus other; 95% intervals from the run-to-run noise "
        + (f"(sd {sd:.4f} per run, {noise['pairs']} re-run pairs):" if sd else "(not measured):")
    ]
    for cell in comparison.get("cells", []):
        where = f"{cell['cell']['size']} D={cell['cell']['budget_tokens']:,}"
        for entry in cell["comparison"].values():
            parts = [
                f"{MEASURED_READINGS[kind].format(ref=reference)} {reading['value']:+.4f} "
                f"{_interval(reading.get('ci'))}"
                for kind, reading in entry.get("measured", {}).items()
            ]
            lines.append(f"  {where}: " + "; ".join(parts))
    return lines


def _multiplier_lines(frontiers: dict) -> list[str]:
    if "skipped" in frontiers:
        return [f"compute multiplier: skipped ({frontiers['skipped']})"]
    lines = []
    for convention, result in sorted(frontiers.items()):
        if "skipped" in result:
            lines.append(f"compute multiplier ({convention}): skipped ({result['skipped']})")
            continue
        baseline = result.get("baseline", "baseline")
        points = result.get("multiplier", [])
        # The smallest, middle and largest compute of the grid; the dashboard plots all of them.
        for point in [points[0], points[len(points) // 2], points[-1]] if points else []:
            flag = " (extrapolated)" if point.get("extrapolated") else ""
            if point["value"] is None:
                # methods.md 2.6: M(C) is undefined where the new arm's loss at C lies below
                # the baseline's fitted floor E (no baseline compute reaches it).
                flag += f" (the baseline's fitted floor lies above {point['group']}'s loss here)"
            lines.append(
                f"compute multiplier {point['group']} over {baseline} ({convention}) at "
                f"C={point['compute']:.3g}: {_number(point['value'], '.3g')} "
                f"{_interval(point.get('ci'), '.3g')}{flag}"
            )
        shared = result.get("shared_exponent", {})
        if shared:
            verdict = "rejected" if shared.get("rejected") else "not rejected"
            single = shared.get("multiplier")
            value = (
                f"single multiplier {single:.3g} {_interval(shared.get('ci'), '.3g')}"
                if single is not None and not shared.get("rejected")
                else "no single multiplier"
            )
            lines.append(
                f"shared exponent ({convention}): p = {_number(shared.get('p_value'), '.3g')}, "
                f"{verdict}; {value}"
            )
    return lines
