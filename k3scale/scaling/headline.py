"""The headline numbers of a fit artifact, as text lines or Markdown tables (reading only).

cosine_vs_wsd: per (size, budget) cell, cosine minus WSD final loss at each schedule's own fitted
optimum and at cosine's optimum for both, then the pooled difference over cells with its sign
count. k2_vs_k3 (and cosine over WSD): the compute multiplier M(C) from both compute-optimal
routes, under both FLOP conventions, and whether the routes agree. Every quantity prints its
verdict; one that is not identified prints why instead of a number, and no interval spanning
more than `verdict.PRINT_DECADES` decades is printed.
"""

from __future__ import annotations

import math
from typing import Any

from k3scale.scaling import verdict

SIGN = "negative: {ref} lower"


def headline_lines(doc: dict[str, Any]) -> list[str]:
    """Human-readable headline of a `k3scale fit` JSON document."""
    results = doc.get("results", {})
    lines: list[str] = []
    if "schedule_comparison" in results:
        lines += _schedule_lines(results["schedule_comparison"])
    if "compute_optimal" in results:
        lines += _multiplier_lines(results["compute_optimal"])
    return lines or ["no headline quantity in this fit"]


def number(value: float | None, digits: int = 3) -> str:
    """`value` to `digits` significant digits; None (NaN in the artifact) is 'undefined'."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "undefined"
    return f"{value:.{digits}g}"


def loss_diff(value: float | None) -> str:
    return "undefined" if value is None else f"{value:+.3f}"


def interval(ci: list | None, fmt=number) -> str:
    if not ci or ci[0] is None or ci[1] is None:
        return "[no interval]"
    return f"[{fmt(ci[0])}, {fmt(ci[1])}]"


def ratio_text(value: float | None, ci: list | None, ruling: str) -> str:
    """A multiplier with its interval, or 'not identified (reason)' (interval only if printable)."""
    if verdict.is_identified(ruling):
        return f"{number(value)} {interval(ci)}"
    shown = ""
    bounded = value is not None and ci and ci[0] and ci[1] and ci[0] > 0
    if bounded and math.log10(ci[1] / ci[0]) <= verdict.PRINT_DECADES:
        shown = f"{number(value)} {interval(ci)}, "
    return f"{shown}{_reason(ruling)}"


def diff_text(value: float | None, ci: list | None, ruling: str) -> str:
    if verdict.is_identified(ruling):
        return f"{loss_diff(value)} {interval(ci, loss_diff)}"
    return _reason(ruling)


def _reason(ruling: str) -> str:
    return "not identified (" + ruling.removeprefix("not identified: ") + ")"


def _schedule_lines(comparison: dict) -> list[str]:
    ref = comparison.get("reference", "cosine")
    lines = [
        f"{ref} minus other schedule, final loss (nats/token; {SIGN.format(ref=ref)}), "
        "95% intervals from each cell optimum's sampling distribution:"
    ]
    for other, p in sorted(comparison.get("pooled", {}).items()):
        if verdict.is_identified(p["verdict"]):
            signs = ", ".join(f"{k} {v}" for k, v in p["point_signs"].items())
            lines.append(
                f"  pooled over {p['identified_cells']} of {p['cells']} cells ({other}): mean "
                f"{loss_diff(p['mean_diff'])} {interval(p['ci'], loss_diff)} ({p['sign']}); "
                f"point signs: {signs}; consistent: {'yes' if p['consistent'] else 'no'}"
            )
        else:
            lines.append(f"  pooled over cells ({other}): {_reason(p['verdict'])}")
    for cell in comparison.get("cells", []):
        where = f"{cell['cell']['size']} D={cell['cell']['budget_tokens']:,}"
        for e in cell["comparison"].values():
            lines.append(
                f"  {where}: own optima {diff_text(e['diff_own'], e['ci_own'], e['verdict_own'])}"
                f"; at {ref}'s optimum {shared_text(e)}"
            )
    if not comparison.get("cells"):
        lines.append("  (no cell has trials of both schedules)")
    noise = comparison.get("run_noise", {})
    if noise:
        lines.append("  " + noise_text(noise))
    return lines


def shared_text(e: dict) -> str:
    """The shared-setting reading; a reason already given for the own optima is not repeated."""
    if e["verdict_shared"] == e["verdict_own"] and not verdict.is_identified(e["verdict_own"]):
        return "not identified (as at own optima)"
    return diff_text(e["diff_shared"], e["ci_shared"], e["verdict_shared"])


def noise_text(noise: dict) -> str:
    if noise.get("sd") is None:
        return "run noise not measured (no residual or seed degrees of freedom)"
    p = noise.get("lack_of_fit_p")
    return (
        f"run noise sd {number(noise.get('sd'))} ({noise.get('method', '')}; quadratic residual "
        f"sd {number(noise.get('quadratic_residual_sd'))}, seed sd {number(noise.get('seed_sd'))}"
        + (f", lack-of-fit p {number(p, 2)}" if p is not None else "")
        + ")"
    )


def multiplier_points(compute_optimal: dict):
    """(conv, route, new, baseline, compute, point) of the smallest, middle and largest compute
    of every route, or (conv, route, None, None, None, reason) where a route was skipped."""
    for conv, result in sorted(compute_optimal.items()):
        if "skipped" in result:
            yield conv, None, None, None, None, result["skipped"]
            continue
        for route, part in sorted(result["routes"].items()):
            if "skipped" in part:
                yield conv, route, None, None, None, part["skipped"]
                continue
            for new, points in sorted(part["multiplier"].items()):
                for i in _three(points):
                    yield conv, route, new, result["baseline"], result["compute"][i], points[i]


def _multiplier_lines(compute_optimal: dict) -> list[str]:
    lines = []
    for conv, route, new, base, compute, point in multiplier_points(compute_optimal):
        where = f"{conv}, {route}" if route else conv
        if new is None:
            lines.append(f"compute multiplier ({where}): not identified ({point})")
            continue
        lines.append(
            f"compute multiplier {new} over {base} ({where} route) at C={compute:.3g}: "
            f"{ratio_text(point['value'], point['ci'], point['verdict'])}"
        )
    for conv, result in sorted(compute_optimal.items()):
        for new, agreement in sorted(result.get("agreement", {}).items()):
            mid = agreement[len(agreement) // 2] if agreement else None
            if mid:
                lines.append(f"routes at the middle compute ({conv}, {new}): {mid['status']}")
    return lines


def _three(points: list) -> list[int]:
    """Smallest, middle and largest compute of the grid (the dashboard plots all)."""
    return sorted({0, len(points) // 2, len(points) - 1}) if points else []


def markdown_tables(doc: dict[str, Any]) -> str:
    """The report's numeric tables in Markdown (analysis/README.md embeds them verbatim)."""
    results = doc.get("results", {})
    parts = [_optima_table(results.get("cell_optima", []))]
    if "schedule_comparison" in results:
        parts.append(_schedule_table(results["schedule_comparison"]))
    if "compute_optimal" in results:
        parts.append(_multiplier_table(results["compute_optimal"]))
    return "\n\n".join(p for p in parts if p) + "\n"


def _optima_table(optima: list[dict]) -> str:
    rows = [
        "| arch | schedule | size | D | trials | quadratic | optimum loss [95%] | best trial | "
        "verdict |",
        "| --- | --- | --- | ---: | ---: | --- | --- | ---: | --- |",
    ]
    for o in optima:
        c, opt = o["cell"], o["optimum"]
        loss = (
            f"{o['loss']:.3f} {interval(o['loss_ci'], lambda v: f'{v:.3f}')}"
            if verdict.is_identified(o["verdict"])
            else "-"
        )
        rows.append(
            f"| {c['arch']} | {c['schedule']} | {c['size']} | {c['budget_tokens']:,} | "
            f"{opt.get('trials', '')} | {opt.get('mode', '')} | {loss} | "
            f"{o['best_trial']['loss']:.3f} | {o['verdict']} |"
        )
    identified = sum(verdict.is_identified(o["verdict"]) for o in optima)
    rows.append("")
    rows.append(f"Cell optima identified: {identified} of {len(optima)}.")
    return "\n".join(rows)


def _schedule_table(comparison: dict) -> str:
    ref = comparison["reference"]
    rows = [
        f"Difference {ref} minus other ({SIGN.format(ref=ref)}), nats/token:",
        "",
        "| size | D | at own optima [95%] | at " + ref + "'s optimum [95%] | lr_opt ratio |",
        "| --- | ---: | --- | --- | ---: |",
    ]
    for cell in comparison["cells"]:
        for e in cell["comparison"].values():
            rows.append(
                f"| {cell['cell']['size']} | {cell['cell']['budget_tokens']:,} | "
                f"{diff_text(e['diff_own'], e['ci_own'], e['verdict_own'])} | "
                f"{shared_text(e)} | "
                f"{number(e['lr_ratio'])} |"
            )
    for other, p in sorted(comparison["pooled"].items()):
        rows.append("")
        if verdict.is_identified(p["verdict"]):
            rows.append(
                f"Pooled over {p['identified_cells']} of {p['cells']} cells ({other}): "
                f"{loss_diff(p['mean_diff'])} {interval(p['ci'], loss_diff)}, {p['sign']}."
            )
        else:
            rows.append(f"Pooled over cells ({other}): {_reason(p['verdict'])}.")
    rows += ["", noise_text(comparison["run_noise"]).capitalize() + "."]
    return "\n".join(rows)


def _multiplier_table(compute_optimal: dict) -> str:
    rows = [
        "| FLOPs | route | C (FLOPs) | M(C) [95%] |",
        "| --- | --- | ---: | --- |",
    ]
    notes = []
    for conv, route, new, _base, compute, point in multiplier_points(compute_optimal):
        if new is None:
            where = f"{conv}, {route} route" if route else conv
            notes.append(f"{where}: not identified ({point}).")
            continue
        rows.append(
            f"| {conv} | {route} | {compute:.3g} | "
            f"{ratio_text(point['value'], point['ci'], point['verdict'])} |"
        )
    return "\n".join([*rows, "", *notes]) if len(rows) > 2 else "\n".join(notes)
