"""An ablation study's component effects as report lines and a Markdown table (reading only)."""

from __future__ import annotations

from k3scale.scaling.values.components import ComponentEffect, ComponentEffects, SumCheck
from k3scale.scaling.values.text import diff_text, ratio_text, reason_text
from k3scale.scaling.values.uncertainty import Estimate


def read(results: dict) -> dict[str, ComponentEffects]:
    """The artifact's component effects by FLOP convention."""
    return {
        conv: ComponentEffects.from_json(doc)
        for conv, doc in results.get("component_effects", {}).items()
    }


def power_text(effect: ComponentEffect) -> str:
    if effect.anchor is None or effect.anchor.multiplier is None:
        return "no anchor multiplier"
    if effect.power is None:
        return f"no power at {effect.anchor.multiplier:g}x (no interval)"
    return f"{effect.power:.2f} at {effect.anchor.multiplier:g}x"


def signed_loss(effect: ComponentEffect) -> Estimate:
    """The loss difference an arm's reading signs: on the re-run seeds that did not choose the
    cells' points where there are enough of them (issue 47), else the all-seeds pooled mean."""
    free = effect.loss.selection_free
    return free if free is not None and free.identified else effect.loss.mean


def _loss_text(effect: ComponentEffect) -> str:
    """The signed loss difference, and the all-seeds mean beside it when that is not it."""
    signed = signed_loss(effect)
    if signed is effect.loss.mean:
        return diff_text(signed)
    return f"{diff_text(signed)} (re-runs; all seeds {diff_text(effect.loss.mean)})"


def _ordered(effects: ComponentEffects) -> list[ComponentEffect]:
    """Components first, then the positive control, then the whole gap (`against`)."""
    control = effects.positive_control
    gap = effects.sum_check.against if effects.sum_check else None
    rank = {control: 1, gap: 2}
    return sorted(effects.effects.values(), key=lambda e: (rank.get(e.arm, 0), e.arm))


def lines(effects: ComponentEffects) -> list[str]:
    """One line per arm (loss difference, multiplier, power at its anchor), then the sum check."""
    conv = effects.convention
    if effects.skipped:
        return [f"component effects ({conv}): not identified ({effects.skipped})"]
    out = []
    for e in _ordered(effects):
        role = " (positive control)" if e.arm == effects.positive_control else ""
        out.append(
            f"{e.arm}{role} vs {effects.full} ({conv}): loss {e.arm} - {effects.full} "
            f"{_loss_text(e)}; worth M = {ratio_text(e.multiplier)} in compute; power "
            f"{power_text(e)}"
        )
    if effects.sum_check:
        out.append(sum_text(effects.sum_check, effects.full, conv))
    return out


def _share_text(share: Estimate) -> str:
    if not share.identified:
        return reason_text(share.verdict)
    lo, hi = share.interval
    return f"{share.value:.0%} [{lo:.0%}, {hi:.0%}]"


def sum_text(check: SumCheck, full: str, conv: str) -> str:
    return (
        f"sum check ({conv}): {full} over {check.against} M = {ratio_text(check.gap)}; the "
        f"{len(check.arms)} components' product {ratio_text(check.explained)}; left over "
        f"(interactions and what no arm switches back) {ratio_text(check.left_over)}; share of "
        f"the gap explained {_share_text(check.share)}"
    )


def verdict_text(m: Estimate, loss: Estimate | None = None) -> str:
    """What a multiplier's interval says of the component: helps, hurts, or not resolved; where
    the multiplier is not identified, what the loss difference (arm - full) says instead."""
    if not m.identified:
        if loss is None or not loss.identified:
            return "not identified"
        lo, hi = loss.interval
        said = "helps" if lo > 0 else "hurts" if hi < 0 else "not resolved"
        held = "holds 0" if lo <= 0 <= hi else "excludes 0"
        return f"in loss: {said} ({held}); in compute: not identified"
    lo, hi = m.interval
    if lo > 1:
        return "helps (excludes 1)"
    if hi < 1:
        return "hurts (excludes 1)"
    return "not resolved (holds 1)"


def anchor_reading(m: Estimate, anchor: float | None) -> str:
    """What the interval says of a published multiplier: agrees (holds it and excludes 1),
    disagrees (excludes it), or cannot tell (holds both it and 1)."""
    if anchor is None:
        return "-"
    if not m.identified:
        return "cannot tell (not identified)"
    lo, hi = m.interval
    if hi < anchor:
        return f"disagrees: below {anchor:g}x"
    if lo > anchor:
        return f"disagrees: above {anchor:g}x"
    if lo > 1 or hi < 1:
        return "agrees"
    return f"cannot tell (holds 1 and {anchor:g}x)"


def table(by_conv: dict[str, ComponentEffects]) -> str:
    """component | switched back | loss diff | M per convention | verdict | power | the anchor's
    reading | anchor | source."""
    convs = sorted(by_conv)
    first = by_conv[convs[0]]
    if first.skipped:
        return f"Component effects: not identified ({first.skipped})."
    head = " | ".join(f"M ({c}) [95%]" for c in convs)
    rows = [
        f"| component | switched back | loss arm - {first.full} [95%] | {head} | verdict "
        f"({convs[0]}) | power at the anchor ({convs[0]}) | against the anchor ({convs[0]}) "
        "| anchor | source |",
        "| --- | --- | --- | "
        + " | ".join("---" for _ in convs)
        + " | --- | --- | --- | --- | --- |",
    ]
    for e in _ordered(first):
        ms = " | ".join(ratio_text(by_conv[c].effects[e.arm].multiplier) for c in convs)
        anchor = e.anchor.text if e.anchor else "-"
        source = e.anchor.source if e.anchor else "-"
        reading = anchor_reading(e.multiplier, e.anchor.multiplier if e.anchor else None)
        rows.append(
            f"| {e.arm} | {e.note} | {_loss_text(e)} | {ms} | {verdict_text(e.multiplier, signed_loss(e))} | "
            f"{power_text(e)} | {reading} | {anchor} | {source} |"
        )
    sums = [sum_text(by_conv[c].sum_check, first.full, c) for c in convs if by_conv[c].sum_check]
    return "\n".join([*rows, "", *(f"{s[0].upper()}{s[1:]}." for s in sums)])
