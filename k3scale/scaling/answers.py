"""One sentence per claim of a fit artifact: the estimate, its interval, and what the interval
excludes (issue 33 item 7, issue 37 item 1).

The report, the dashboard's headline and analysis/README.md's generated blocks all open with
these sentences, so a reader meets the same answer wherever they look. A schedule study answers
with its selection-free difference (the re-runs at the chosen points, paired by seed), with the
pooled difference over all seeds and the check across sizes as context; a study of arms answers
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
    route_agreement,
)
from k3scale.scaling.values.text import diff_text, difference_says, reason_text
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


def _difference_text(e: Estimate, ref: str, other: str) -> str:
    lo, hi = e.interval
    says = difference_says(e, ref, other)
    return f"{_signed(e.value)} [{_signed(lo)}, {_signed(hi)}] nats, {says}"


def _pooled_text(p: PooledDifference, ref: str, other: str) -> str:
    """The all-seeds pooled mean with what it says and the check across sizes, or why not."""
    if not p.mean.identified:
        return reason_text(p.mean.verdict)
    text = _difference_text(p.mean, ref, other)
    check = p.across_sizes
    if check is not None and check.identified:
        text += (
            f" (across {p.clusters} sizes, without the seed model: "
            f"[{_signed(check.interval[0])}, {_signed(check.interval[1])}])"
        )
    return text


def difference_answer(p: PooledDifference, ref: str, other: str) -> str:
    """The difference ref - other that the study signs, and what its interval says.

    The tuning seed chose each schedule's point, so a reading that includes it carries the
    selection's luck: the signed reading is the selection-free one (the re-runs at the chosen
    points, paired by seed) where it is identified, with the all-seeds pooled mean beside it as
    context; otherwise the pooled mean is signed and the line says why.
    """
    pooled = f"pooled over {p.identified_cells} of {p.cells} cells (paired by seed)"
    free = p.selection_free
    if free is None or not free.identified:
        why = (
            "no paired re-runs on other seeds"
            if free is None
            else f"the selection-free reading is not identified: {free.verdict.reason}"
        )
        return (
            f"{ref} - {other}, {pooled}, with the tuning seed that chose the points ({why}): "
            f"{_pooled_text(p, ref, other)}."
        )
    signs = p.pair_signs
    return (
        f"{ref} - {other} on the re-runs that did not choose the points ({p.pairs} pairs at "
        f"matched seeds in {p.pair_cells} of {p.cells} cells; signed here, since the tuning seed "
        f"chose each schedule's point and its differences carry the selection's luck): "
        f"{_difference_text(free, ref, other)}; {ref} lower in {signs.get(f'{ref} lower', 0)} "
        f"and {other} lower in {signs.get(f'{other} lower', 0)} of {p.pairs} pairs. "
        f"As context, all seeds {pooled}: {_pooled_text(p, ref, other)}."
    )


def multiplier_answers(comparison: Comparison, new: str) -> list[str]:
    """The multiplier at the middle of the overlap and its rate, read from the routes that pass
    their own checks (methods.md 4.11): a number is signed only where two or more of them agree;
    with one, it stands unconfirmed; with none, no number is printed. Then one line naming each
    refused route and why."""
    where = f"{new} over {comparison.baseline} (6ND)"
    middle = len(comparison.compute) // 2
    at = comparison.compute[middle]
    passing = {
        name: route.multiplier[new][middle]
        for name, route in sorted(comparison.routes.items())
        if not route.skipped
        and new in route.multiplier
        and route.multiplier[new][middle].identified
    }
    rates = {
        name: route.rate[new]
        for name, route in sorted(comparison.routes.items())
        if not route.skipped and new in route.rate and route.rate[new].identified
    }
    out = [
        f"{where}, M at C = {at:.3g} FLOPs (mid-overlap): "
        + _routes_say(passing, _ratio_says, "M(C)")
        + _span(comparison, new, passing)
        + ".",
        f"{where}, rate d log M / d log C: " + _routes_say(rates, _rate_says, "the rate") + ".",
    ]
    refused = _refusals(comparison, new, middle)
    if refused:
        out.append(f"{where}, routes that sign nothing here: {refused}.")
    return out


def _routes_say(passing: dict[str, Estimate], says, name: str) -> str:
    """What the passing routes' estimates say together: the one route's reading, unconfirmed;
    several that agree, each with its reading; several that disagree, their spread only."""
    if not passing:
        return f"no route passes its checks, so {name} is not read"
    agreement = route_agreement(passing)
    each = "; ".join(f"{route} route {says(e)}" for route, e in passing.items())
    if len(passing) == 1:
        return f"only the {each} (no second route to confirm it)"
    if agreement["status"].startswith("agree"):
        return f"the routes that pass agree: {each}"
    return (
        f"the routes that pass disagree ({', '.join(passing)}: from {agreement['low']:.3g} to "
        f"{agreement['high']:.3g}), so no number is signed"
    )


def _span(comparison: Comparison, new: str, passing: dict[str, Estimate]) -> str:
    """The range of the passing routes' M(C) over the overlap (one route: its own range)."""
    shown = [
        e.value for name in passing for e in comparison.routes[name].multiplier[new] if e.identified
    ]
    if len(passing) != 1 or not shown:
        return ""
    (name,) = passing
    count = len(comparison.routes[name].multiplier[new])
    return (
        f"; over the overlap it reads M at {len(shown)} of {count} computes, from "
        f"{min(shown):.3g} to {max(shown):.3g}"
    )


def _refusals(comparison: Comparison, new: str, middle: int) -> str:
    """Each route without M at the middle compute, with its reason (skipped or refused)."""
    out = []
    for name, route in sorted(comparison.routes.items()):
        if route.skipped:
            out.append(f"{name} ({route.skipped})")
        elif new in route.multiplier and not route.multiplier[new][middle].identified:
            out.append(f"{name} ({route.multiplier[new][middle].verdict.reason})")
    return "; ".join(out)


def component_answers(effects: ComponentEffects) -> list[str]:
    """The positive control's verdict, and what it implies for every other arm; the sum check.

    The control is read in compute where its multiplier is identified, else in loss (the
    difference every arm is measured in first): a control whose loss difference excludes 0
    shows that the design sees an effect of its kind even where no frontier converts it into
    compute."""
    if effects.skipped:
        return [f"component effects (6ND): not identified ({effects.skipped})."]
    control = effects.effects.get(effects.positive_control)
    out = []
    if control is not None:
        head = f"positive control {control.arm} ({control.note})"
        m, loss = control.multiplier, component_text.signed_loss(control)
        if m.identified:
            line = f"{head}, worth to {effects.full} in compute (6ND): {_ratio_says(m)}"
            seen = m.interval[0] > 1
        else:
            on = "on the re-runs" if loss is not control.loss.mean else "over all seeds"
            line = (
                f"{head}, loss {control.arm} - {effects.full} {on}: {diff_text(loss)} nats; its "
                f"worth in compute (6ND) is {reason_text(m.verdict)}"
            )
            seen = loss.identified and loss.interval[0] > 0
        if not seen:
            line += (
                "; the design does not see the control's effect at this scale, so an arm whose "
                "interval holds 0 is no evidence that its component does nothing"
            )
        out.append(line + ".")
    if effects.sum_check is not None:
        out.append(component_text.sum_text(effects.sum_check, effects.full, "6ND") + ".")
    return out


def _ratio_says(e: Estimate) -> str:
    if not e.identified:
        return reason_text(e.verdict)
    lo, hi = e.interval
    text = f"M = {e.value:.3g} [{lo:.3g}, {hi:.3g}]"
    if lo > 1:
        return f"{text}, an advantage of {lo:.3g}x to {hi:.3g}x"
    if hi < 1:
        return f"{text}, a disadvantage (the interval lies below 1)"
    return f"{text}, not resolved (the interval holds 1)"


def _rate_says(e: Estimate) -> str:
    if not e.identified:
        return reason_text(e.verdict)
    lo, hi = e.interval
    text = f"{_signed(e.value)} [{_signed(lo)}, {_signed(hi)}]"
    if lo > 0:
        return f"{text}, the advantage grows with compute"
    if hi < 0:
        return f"{text}, the advantage shrinks with compute"
    return f"{text}, the interval holds 0 (no change with compute is resolved)"
