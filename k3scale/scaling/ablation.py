"""An ablation study's component effects from its cell estimates (issue 38): the glue between
`study.cell_estimates` and `estimates/arm_effects.py`, under one FLOP convention."""

from __future__ import annotations

import dataclasses

from k3scale.scaling import study
from k3scale.scaling.estimates import arm_effects
from k3scale.scaling.estimates.arm_effects import ArmCell
from k3scale.scaling.values.components import Ablation, ComponentEffect, ComponentEffects


def _cell(e: study.CellEstimate, conv: str) -> ArmCell:
    return ArmCell(e.cell, e.compute[conv], e.optimum, e.reruns)


def component_effects(
    estimates: list[study.CellEstimate], ablation: Ablation, conv: str
) -> ComponentEffects:
    """Every arm against `ablation.full` cell by cell and pooled, with the anchors' power and
    the sum check against `ablation.against`."""
    full = [e for e in estimates if e.cell["arch"] == ablation.full]
    identified = [e for e in full if e.optimum.identified and e.optimum.draws is not None]
    if not identified:
        why = f"{ablation.full} has no identified cell optimum with draws"
        return ComponentEffects(ablation.full, conv, ablation.positive_control, {}, None, why)
    full_arm = study.arm_of_cells(ablation.full, identified, conv)
    frontier = arm_effects.full_model_frontier(full_arm)
    key = study.design_cells(estimates)
    full_at = {key(e): e for e in full}
    effects: dict[str, ComponentEffect] = {}
    logs = {}
    for arm in sorted({e.cell["arch"] for e in estimates} - {ablation.full}):
        pairs = [
            (_cell(e, conv), _cell(full_at[key(e)], conv))
            for e in estimates
            if e.cell["arch"] == arm and key(e) in full_at
        ]
        effect, logs[arm] = arm_effects.arm_effect(
            arm, ablation.notes.get(arm, ""), pairs, frontier, ablation.full
        )
        anchor = ablation.anchors.get(arm)
        power = (
            arm_effects.power(anchor.multiplier, logs[arm].draws)
            if anchor and anchor.multiplier and logs[arm] is not None
            else None
        )
        effects[arm] = dataclasses.replace(effect, anchor=anchor, power=power)
    parts = {arm: logs.get(arm) for arm in ablation.sum_arms}
    check = arm_effects.sum_check(ablation.against, logs.get(ablation.against), parts)
    return ComponentEffects(
        ablation.full, conv, ablation.positive_control, effects, check, method=_method(frontier)
    )


def _method(frontier) -> str:
    """How the multipliers were read: through the full model's law, or, where its checks refuse
    it, through its monotone frontier (and why)."""
    through = (
        "the full model's frontier law (envelope route)"
        if frontier.refused is None
        else f"the full model's monotone frontier (its frontier law is refused: {frontier.refused})"
    )
    return (
        "arm minus full at each design cell (rung, budget rank), paired by seed; multiplier "
        f"C_arm / C* with L*(C*) = L*(C_full) + diff on {through}; pooled: mean difference and "
        "geometric-mean multiplier over cells; percentile intervals over the shared draws"
    )
