"""One sentence per claim of a fit artifact: the estimate, its interval, and what the interval
excludes (issue 33 item 7, issue 37 item 1).

The report, the dashboard's headline and analysis/README.md's generated blocks all open with
these sentences, so a reader meets the same answer wherever they look. A schedule study answers
with its pooled difference (paired by seed) and the check across sizes; a study of arms answers
with the compute multiplier at the middle of the overlap under 6ND, by each identified route,
the range of M(C) over the overlap and its rate; an ablation with its positive control's
verdict and the sum check.
"""

from __future__ import annotations

from typing import Any

from k3scale.scaling import component_text
from k3scale.scaling.values.components import ComponentEffects
from k3scale.scaling.values.fitdoc import (
    Comparison,
    PooledDifference,
    read_comparisons,
    read_schedule_comparison,
)
from k3scale.scaling.values.text import reason_text
from k3scale.scaling.values.uncertainty import Estimate

# The FLOP convention the answers read (the K3 report's multiplier is in 6 N D).
ANSWER_COMPUTE = "c_6n"


def answer_lines(doc: dict[str, Any]) -> list[str]:
    """One line per claim the artifact can answer (none when it holds no comparison)."""
    results = doc.get("results", {})
    effects = component_text.read(results).get(ANSWER_COMPUTE)
    if effects is not None:
        return component_answers(effects)
    schedules = read_schedule_comparison(results)
    if schedules is not None:
        return [
            difference_answer(p, schedules.reference, other)
            for other, p in sorted(schedules.pooled.items())
        ]
    comparison = read_comparisons(results).get(ANSWER_COMPUTE)
    if comparison is None:
        return []
    if comparison.skipped:
        return [f"compute multiplier (6ND): not identified ({comparison.skipped})"]
    return [line for new in comparison.others for line in multiplier_answers(comparison, new)]


def answers_markdown(doc: dict[str, Any]) -> str:
    """The answers as a Markdown list ahead of the report's tables ('' when there are none)."""
    lines = answer_lines(doc)
    return "".join(f"- **{line}**\n" for line in lines) + "\n" if lines else ""


def _signed(value: float) -> str:
    return f"{value:+.3f}"


def difference_answer(p: PooledDifference, ref: str, other: str) -> str:
    """The pooled difference ref - other and the differences its interval excludes."""
    head = f"{ref} - {other}, pooled over {p.identified_cells} of {p.cells} cells (paired by seed)"
    e = p.mean
    if not e.identified:
        return f"{head}: {reason_text(e.verdict)}"
    lo, hi = e.interval
    if hi < 0:
        says = f"{ref} lower, by {-hi:.3f} to {-lo:.3f} nats; it excludes no difference"
    elif lo > 0:
        says = f"{other} lower, by {lo:.3f} to {hi:.3f} nats; it excludes no difference"
    else:
        says = (
            f"not resolved; it excludes {ref} lower by more than {-lo:.3f} nats and {other} "
            f"lower by more than {hi:.3f}"
        )
    line = f"{head}: {_signed(e.value)} [{_signed(lo)}, {_signed(hi)}] nats: {says}"
    check = p.across_sizes
    if check is not None and check.identified:
        line += (
            f" (across {p.clusters} sizes, without the seed model: "
            f"[{_signed(check.interval[0])}, {_signed(check.interval[1])}])"
        )
    return line + "."


def multiplier_answers(comparison: Comparison, new: str) -> list[str]:
    """Per route: the middle of the overlap, the range and the rate where it has M(C), else why
    not."""
    out = []
    for route_name, route in sorted(comparison.routes.items()):
        where = f"{new} over {comparison.baseline}, {route_name} route (6ND)"
        values = route.multiplier.get(new)
        if route.skipped or not values:
            out.append(f"{where}: not identified ({route.skipped or 'no M(C)'}).")
            continue
        middle = len(values) // 2
        at = comparison.compute[middle]
        line = f"{where}, at C = {at:.3g} FLOPs (mid-overlap): M = {_ratio_says(values[middle])}"
        shown = [e.value for e in values if e.identified]
        if shown:
            line += (
                f"; identified at {len(shown)} of {len(values)} computes of the overlap, "
                f"{min(shown):.3g} to {max(shown):.3g}"
            )
        out.append(line + ".")
        rate = route.rate.get(new)
        if rate is not None:
            out.append(f"{where}: {_rate_says(rate)}.")
    return out


def component_answers(effects: ComponentEffects) -> list[str]:
    """The positive control's verdict, and what it implies for every other arm; the sum check."""
    if effects.skipped:
        return [f"component effects (6ND): not identified ({effects.skipped})."]
    control = effects.effects.get(effects.positive_control)
    out = []
    if control is not None:
        m = control.multiplier
        line = (
            f"positive control {control.arm} ({control.note}), worth to {effects.full} in "
            f"compute (6ND): M = {_ratio_says(m)}"
        )
        if not m.identified or m.interval[0] <= 1:
            line += (
                "; the design does not see the optimizer's effect at this scale, so an arm "
                "whose interval holds 1 is no evidence that its component does nothing"
            )
        out.append(line + ".")
    if effects.sum_check is not None:
        out.append(component_text.sum_text(effects.sum_check, effects.full, "6ND") + ".")
    return out


def _ratio_says(e: Estimate) -> str:
    if not e.identified:
        return reason_text(e.verdict)
    lo, hi = e.interval
    text = f"{e.value:.3g} [{lo:.3g}, {hi:.3g}]"
    if lo > 1:
        return f"{text}, excluding no advantage (M = 1) and M above {hi:.3g}"
    if hi < 1:
        return f"{text}, excluding no advantage (M = 1) and M below {lo:.3g}"
    return f"{text}, not resolved: excluding M above {hi:.3g} and below {lo:.3g}"


def _rate_says(e: Estimate) -> str:
    name = "rate d log M / d log C"
    if not e.identified:
        return f"{name} {reason_text(e.verdict)}"
    lo, hi = e.interval
    text = f"{name} = {_signed(e.value)} [{_signed(lo)}, {_signed(hi)}]"
    if lo > 0:
        return f"{text}: the advantage grows with compute"
    if hi < 0:
        return f"{text}: the advantage shrinks with compute"
    return (
        f"{text}: it holds 0 (a constant advantage is not excluded) and excludes slopes above "
        f"{_signed(hi)} and below {_signed(lo)}"
    )
