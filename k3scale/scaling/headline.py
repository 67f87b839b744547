"""The headline numbers of a fit artifact, as text lines or Markdown tables (reading only).

cosine_vs_wsd: per (size, budget) cell, cosine minus WSD final loss at each schedule's own fitted
optimum and at cosine's optimum for both, then the pooled difference over cells with its sign
count: signed on the re-runs at the chosen points (paired by seed, the tuning seed left out)
where they exist, with the all-seeds mean as context. k2_vs_k3 (and cosine over WSD): the
compute multiplier M(C) from both compute-optimal routes, under both FLOP conventions, and
whether the routes agree. Every quantity prints its verdict; one that is not identified prints
why instead of a number.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from k3scale.scaling import component_text
from k3scale.scaling.values.fitdoc import (
    CellDifference,
    CellOptimumRecord,
    Comparison,
    PooledDifference,
    ScheduleComparison,
    read_cell_optima,
    read_comparisons,
    read_schedule_comparison,
)
from k3scale.scaling.values.text import (
    diff_text,
    difference_says,
    interval,
    number,
    ratio_text,
    reason_text,
)
from k3scale.scaling.values.uncertainty import Estimate

SIGN = "negative: {ref} lower"


def headline_lines(doc: dict[str, Any]) -> list[str]:
    """Human-readable headline of a `k3scale fit` JSON document."""
    results = doc.get("results", {})
    lines: list[str] = []
    comparison = read_schedule_comparison(results)
    if comparison is not None:
        lines += _schedule_lines(comparison)
    if "compute_optimal" in results:
        lines += _multiplier_lines(read_comparisons(results))
    effects = component_text.read(results)
    if effects:
        # The first FLOP convention's lines (6ND); the table gives every convention.
        lines += component_text.lines(effects[min(effects)])
    if "rerun_check" in results:
        lines.append(rerun_text(results["rerun_check"]))
    if results.get("run_noise", {}).get("seed_effects") and comparison is None:
        lines.append(seed_effects_text(results["run_noise"]["seed_effects"]))
    return lines or ["no headline quantity in this fit"]


def rerun_text(check: dict) -> str:
    """The real-data coverage line: re-runs held by their seeds' predictive intervals."""
    if not check["runs"]:
        return f"re-runs against their predictive intervals: none scored ({check.get('skipped')})"
    lo, hi = check["rate_interval"]
    nominal = check["nominal"]
    verdict_part = (
        f"consistent with the nominal {nominal:.2f}"
        if check["holds"]
        else f"NOT consistent with the nominal {nominal:.2f}"
    )
    failing = check["failing_cells"]
    missed = "; missed in " + ", ".join(_cell_name(c) for c in failing) if failing else ""
    return (
        f"re-runs held by their seeds' {nominal:.0%} predictive intervals: {check['hits']} of "
        f"{check['runs']} (binomial 95% [{lo:.2f}, {hi:.2f}]; {verdict_part}){missed}"
    )


def _cell_name(cell: dict) -> str:
    return f"{cell['size']} {cell['schedule']} D={cell['budget_tokens']:,}"


def seed_effects_text(seeds: dict) -> str:
    """The seed components of the run noise, in one line."""
    effects = ", ".join(f"seed {k} {v:+.3f}" for k, v in seeds["seed_effects"].items())
    share = (
        f", {seeds['slot_share']:.2f} of it shared by a slot's cells" if seeds["slot_share"] else ""
    )
    return (
        f"seed effects: study-wide sd {number(seeds['shared_sd'])} ({seeds['shared_df']} df; "
        f"{effects}), within a cell sd {number(seeds['cell_sd'])} ({seeds['cell_df']} df{share})"
    )


def _schedule_lines(comparison: ScheduleComparison) -> list[str]:
    ref = comparison.reference
    lines = [
        f"{ref} minus other schedule, final loss (nats/token; {SIGN.format(ref=ref)}), "
        "95% intervals from each cell optimum's sampling distribution:"
    ]
    for other, p in sorted(comparison.pooled.items()):
        if p.selection_free is not None:
            lines.append(f"  {_selection_free_text(p, ref, other)}")
        role = _pooled_role(p)
        if p.mean.identified:
            signs = ", ".join(f"{k} {v}" for k, v in p.point_signs.items())
            sign = difference_says(p.mean, ref, other)
            lines.append(
                f"  {role}pooled over {p.identified_cells} of {p.cells} cells ({other}): mean "
                f"{diff_text(p.mean)} ({sign}); "
                f"point signs: {signs}; consistent: {'yes' if p.consistent else 'no'}"
            )
        else:
            lines.append(f"  {role}pooled over cells ({other}): {reason_text(p.mean.verdict)}")
    for d in comparison.cells:
        where = f"{d.cell['size']} D={d.cell['budget_tokens']:,}"
        lines.append(
            f"  {where}: own optima {diff_text(d.own)}; at {ref}'s optimum {shared_text(d)}"
        )
    if not comparison.cells:
        lines.append("  (no cell has trials of both schedules)")
    if comparison.run_noise:
        lines.append("  " + noise_text(comparison.run_noise))
    return lines


def _pooled_role(p: PooledDifference) -> str:
    """'' without a selection-free reading; else whether the all-seeds mean is signed (that
    reading is not identified) or context beside it (the one signed where identified)."""
    if p.selection_free is None:
        return ""
    return "context, all seeds " if p.selection_free.identified else "signed, all seeds "


def _selection_free_text(p: PooledDifference, ref: str, other: str) -> str:
    """The re-runs at the chosen points paired by seed: the signed reading, and why."""
    e = p.selection_free
    where = "on the re-runs that did not choose the points"
    if not e.identified:
        return f"{where} ({other}): {reason_text(e.verdict)}"
    signs = ", ".join(f"{k} {v}" for k, v in p.pair_signs.items())
    return (
        f"signed, {where} ({other}; {p.pairs} pairs at matched seeds in {p.pair_cells} cells), "
        "since the tuning seed chose the points and its differences carry the selection's luck: "
        f"mean {diff_text(e)} ({difference_says(e, ref, other)}); pair signs: {signs}"
    )


def shared_text(d: CellDifference) -> str:
    """The shared-setting reading; a reason already given for the own optima is not repeated."""
    if d.shared.verdict == d.own.verdict and not d.own.identified:
        return "not identified (as at own optima)"
    return diff_text(d.shared)


def noise_text(noise: dict) -> str:
    if noise.get("sd") is None:
        return "run noise not measured (no residual or seed degrees of freedom)"
    p = noise.get("lack_of_fit_p")
    seeds = noise.get("seed_effects")
    return (
        f"run noise sd {number(noise.get('sd'))} ({noise.get('method', '')}; quadratic residual "
        f"sd {number(noise.get('quadratic_residual_sd'))}, seed sd {number(noise.get('seed_sd'))}"
        + (f", lack-of-fit p {number(p, 2)}" if p is not None else "")
        + ")"
        + (f"; {seed_effects_text(seeds)}" if seeds else "; seed effects not measured (no re-runs)")
    )


@dataclasses.dataclass(frozen=True)
class MultiplierRow:
    """One printed M(C): a route's estimate at one compute value, or why there is none.

    Attributes:
        conv: FLOP convention.
        route: "surface" or "envelope" (None when the whole convention was skipped).
        new, baseline: the arms compared (None when skipped).
        compute: the compute value (None when skipped).
        estimate: M(C) with interval and verdict (None when skipped).
        skipped: why the route or convention has no multiplier (None otherwise).
    """

    conv: str
    route: str | None = None
    new: str | None = None
    baseline: str | None = None
    compute: float | None = None
    estimate: Estimate | None = None
    skipped: str | None = None

    @property
    def where(self) -> str:
        return f"{self.conv}, {self.route}" if self.route else self.conv


def multiplier_rows(
    comparisons: dict[str, Comparison], every_point: bool = False
) -> Iterator[MultiplierRow]:
    """Every route's M(C) at the smallest, middle and largest compute (at every compute value
    with `every_point`), or why a route (or a whole convention) was skipped."""
    for conv, comparison in comparisons.items():
        if comparison.skipped:
            yield MultiplierRow(conv, skipped=comparison.skipped)
            continue
        for route, part in sorted(comparison.routes.items()):
            if part.skipped:
                yield MultiplierRow(conv, route, skipped=part.skipped)
                continue
            for new, points in sorted(part.multiplier.items()):
                for i in range(len(points)) if every_point else _three(points):
                    yield MultiplierRow(
                        conv, route, new, comparison.baseline, comparison.compute[i], points[i]
                    )


def _multiplier_lines(comparisons: dict[str, Comparison]) -> list[str]:
    lines = []
    for row in multiplier_rows(comparisons):
        if row.estimate is None:
            lines.append(f"compute multiplier ({row.where}): not identified ({row.skipped})")
            continue
        lines.append(
            f"compute multiplier {row.new} over {row.baseline} ({row.where} route) at "
            f"C={row.compute:.3g}: {ratio_text(row.estimate)}"
        )
    lines += list(_rate_texts(comparisons))
    for conv, comparison in comparisons.items():
        for new in comparison.others:
            agreement = comparison.agreement(new)
            if agreement:
                mid = agreement[len(agreement) // 2]
                lines.append(f"routes at the middle compute ({conv}, {new}): {mid['status']}")
    return lines


def rate_text(e: Estimate, new: str, baseline: str, where: str) -> str:
    """The rate of M(C) with its interval and where the interval lies against 0."""
    name = f"rate of M(C) {new} over {baseline} ({where}), d log M / d log C"
    if not e.identified:
        return f"{name}: {reason_text(e.verdict)}"
    lo, hi = e.interval
    # One route's reading, in words that claim no trend: a trend is signed only in the answer
    # lines, where routes that pass agree (the c_attn monotone rate excludes 0 under no effect
    # in about a fifth of simulated studies).
    trend = (
        "its interval lies above 0"
        if lo > 0
        else "its interval lies below 0"
        if hi < 0
        else "its interval holds 0"
    )
    return f"{name}: {e.value:+.3f} [{lo:+.3f}, {hi:+.3f}] ({trend})"


def _rate_texts(comparisons: dict[str, Comparison]) -> Iterator[str]:
    """`rate_text` of every route that has M(C)."""
    for conv, comparison in comparisons.items():
        for route, part in sorted(comparison.routes.items()):
            for new, e in sorted(part.rate.items()):
                yield rate_text(e, new, comparison.baseline, f"{conv}, {route} route")


def _three(points: list) -> list[int]:
    """Smallest, middle and largest compute of the grid (the dashboard plots all)."""
    return sorted({0, len(points) // 2, len(points) - 1}) if points else []


def markdown_tables(doc: dict[str, Any]) -> str:
    """The report's numeric tables in Markdown (analysis/README.md embeds them verbatim)."""
    results = doc.get("results", {})
    parts = [_optima_table(read_cell_optima(results))]
    if "rerun_check" in results:
        parts.append(_rerun_paragraph(results))
    comparison = read_schedule_comparison(results)
    if comparison is not None:
        parts.append(_schedule_table(comparison))
    if "compute_optimal" in results:
        parts.append(_multiplier_table(read_comparisons(results)))
    if "component_effects" in results:
        parts.append(component_text.table(component_text.read(results)))
    return "\n\n".join(p for p in parts if p) + "\n"


def _optima_table(optima: list[CellOptimumRecord]) -> str:
    rows = [
        "| arch | schedule | size | D | trials | quadratic | optimum loss [95%] | best trial | "
        "verdict |",
        "| --- | --- | --- | ---: | ---: | --- | --- | ---: | --- |",
    ]
    for o in optima:
        c = o.cell
        loss = (
            f"{o.loss.value:.3f} {interval(o.loss.interval, lambda v: f'{v:.3f}')}"
            if o.loss.identified
            else "-"
        )
        rows.append(
            f"| {c['arch']} | {c['schedule']} | {c['size']} | {c['budget_tokens']:,} | "
            f"{o.trials} | {o.mode} | {loss} | "
            f"{o.best_trial['loss']:.3f} | {o.loss.verdict.to_json()} |"
        )
    identified = sum(o.loss.identified for o in optima)
    rows.append("")
    rows.append(f"Cell optima identified: {identified} of {len(optima)}.")
    return "\n".join(rows)


def _rerun_paragraph(results: dict) -> str:
    """The real-data coverage line, and the seed effects it rests on."""
    lines = [rerun_text(results["rerun_check"]).capitalize() + "."]
    seeds = results.get("run_noise", {}).get("seed_effects")
    if seeds:
        lines += ["", seed_effects_text(seeds).capitalize() + "."]
    return "\n".join(lines)


def _schedule_table(comparison: ScheduleComparison) -> str:
    ref = comparison.reference
    rows = [
        f"Difference {ref} minus other ({SIGN.format(ref=ref)}), nats/token:",
        "",
        "| size | D | at own optima [95%] | at " + ref + "'s optimum [95%] | lr_opt ratio |",
        "| --- | ---: | --- | --- | ---: |",
    ]
    for d in comparison.cells:
        rows.append(
            f"| {d.cell['size']} | {d.cell['budget_tokens']:,} | {diff_text(d.own)} | "
            f"{shared_text(d)} | {number(d.lr_ratio)} |"
        )
    for other, p in sorted(comparison.pooled.items()):
        rows.append("")
        if p.selection_free is not None:
            rows += [_capital(_selection_free_text(p, ref, other)) + ".", ""]
        role = _pooled_role(p)
        if p.mean.identified:
            rows.append(
                _capital(f"{role}pooled over {p.identified_cells} of {p.cells} cells ({other}): ")
                + f"{diff_text(p.mean)}, {difference_says(p.mean, ref, other)}."
            )
        else:
            rows.append(
                _capital(f"{role}pooled over cells ({other}): ") + reason_text(p.mean.verdict) + "."
            )
    rows += ["", noise_text(comparison.run_noise).capitalize() + "."]
    return "\n".join(rows)


def _capital(text: str) -> str:
    return text[0].upper() + text[1:]


def _multiplier_table(comparisons: dict[str, Comparison]) -> str:
    rows = [
        "| FLOPs | route | C (FLOPs) | M(C) [95%] |",
        "| --- | --- | ---: | --- |",
    ]
    notes = []
    for row in multiplier_rows(comparisons, every_point=True):
        if row.estimate is None:
            where = f"{row.conv}, {row.route} route" if row.route else row.conv
            notes.append(f"{where}: not identified ({row.skipped}).")
            continue
        rows.append(
            f"| {row.conv} | {row.route} | {row.compute:.3g} | {ratio_text(row.estimate)} |"
        )
    notes += [f"{text[0].upper()}{text[1:]}." for text in _rate_texts(comparisons)]
    return "\n".join([*rows, "", *notes]) if len(rows) > 2 else "\n".join(notes)
