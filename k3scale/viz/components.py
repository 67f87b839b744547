"""The ablation study's forest plot: one row per component, its effective-compute multiplier to
the full model with its 95% interval, and the published anchor beside it (issue 38)."""

from __future__ import annotations

import plotly.graph_objects as go

from k3scale.errors import K3ScaleError
from k3scale.scaling.component_text import sum_text
from k3scale.scaling.values.components import ComponentEffect, ComponentEffects
from k3scale.viz import theme
from k3scale.viz.fits import DashboardFits
from k3scale.viz.panel import Panel

IDENTIFIED_COLOUR = "#d62728"
NOT_IDENTIFIED_COLOUR = "#999999"
ANCHOR_COLOUR = "#1f77b4"
COMPONENT_NOTE = (
    "Ratio convention: M = the compute {full} would need without the component over the compute "
    "it needs with it, at matched rung and tokens; M > 1 means the component is worth that "
    "factor of compute to {full}."
)


def _rows(effects: ComponentEffects) -> list[ComponentEffect]:
    """Components by multiplier, then the positive control, then the whole gap at the top."""
    control = effects.positive_control
    gap = effects.sum_check.against if effects.sum_check else None
    parts = [e for e in effects.effects.values() if e.arm not in (control, gap)]
    parts.sort(key=lambda e: e.multiplier.value if e.multiplier.value is not None else 0.0)
    ends = [effects.effects[a] for a in (control, gap) if a in effects.effects]
    return parts + ends


def _label(effect: ComponentEffect, effects: ComponentEffects) -> str:
    if effect.arm == effects.positive_control:
        return f"{effect.arm} (positive control)"
    if effects.sum_check and effect.arm == effects.sum_check.against:
        return f"{effects.full} over {effect.arm} (the whole gap)"
    return effect.arm


def _hover(effect: ComponentEffect) -> str:
    m, loss = effect.multiplier, effect.loss.mean
    parts = [effect.note, f"M {theme.fmt_num(m.value)} {_interval(m.interval)}"]
    if loss.value is not None:
        parts.append(f"loss {effect.arm} − full {loss.value:+.4f} {_interval(loss.interval)}")
    parts.append(m.verdict.to_json())
    if effect.anchor:
        parts.append(f"anchor: {effect.anchor.text} ({effect.anchor.source})")
    return "<br>".join(parts)


def _interval(ci: list | None) -> str:
    return theme.fmt_interval(*ci) if ci else "[no interval]"


def forest_panel(fits: DashboardFits, conv: str) -> Panel:
    """Each component's multiplier [95%] with its anchor, the positive control and the gap."""
    effects = fits.component_effects.get(conv)
    if effects is None or effects.skipped or not effects.effects:
        why = effects.skipped if effects else "the fit has no component effects"
        raise K3ScaleError(f"dashboard: component effects ({conv}) not drawn: {why}")
    rows = _rows(effects)
    if all(e.multiplier.value is None for e in rows):
        reasons = sorted({e.multiplier.verdict.reason for e in rows if e.multiplier.verdict.reason})
        # The page lists this line where the figure would be: no axis for numbers not known.
        raise K3ScaleError(
            f"dashboard: component effects ({conv}) not drawn: no multiplier is defined "
            f"({'; '.join(reasons)})"
        )
    labels = [_label(e, effects) for e in rows]
    fig = go.Figure()
    for identified in (True, False):
        mine = [
            (label, e)
            for label, e in zip(labels, rows, strict=True)
            if e.multiplier.value is not None and e.multiplier.identified == identified
        ]
        if not mine:
            continue
        x = [e.multiplier.value for _, e in mine]
        lo = [v - (e.multiplier.interval or [v, v])[0] for v, (_, e) in zip(x, mine, strict=True)]
        hi = [(e.multiplier.interval or [v, v])[1] - v for v, (_, e) in zip(x, mine, strict=True)]
        fig.add_trace(
            go.Scatter(
                x=x,
                y=[label for label, _ in mine],
                mode="markers",
                marker={"color": IDENTIFIED_COLOUR if identified else NOT_IDENTIFIED_COLOUR},
                error_x={"type": "data", "symmetric": False, "array": hi, "arrayminus": lo},
                name="multiplier [95%]" if identified else "not identified",
                hovertext=[_hover(e) for _, e in mine],
                hoverinfo="text",
            )
        )
    anchored = [
        (label, e)
        for label, e in zip(labels, rows, strict=True)
        if e.anchor and e.anchor.multiplier
    ]
    if anchored:
        fig.add_trace(
            go.Scatter(
                x=[e.anchor.multiplier for _, e in anchored],
                y=[label for label, _ in anchored],
                mode="markers",
                marker={"symbol": "diamond-open", "size": 11, "color": ANCHOR_COLOUR},
                name="published anchor",
                hovertext=[f"{e.anchor.text} ({e.anchor.source})" for _, e in anchored],
                hoverinfo="text",
            )
        )
    fig.add_vline(x=1.0, line={"color": "#999999", "width": 1})
    values = [1.0] + [e.anchor.multiplier for _, e in anchored]
    values += [v for e in rows for v in (e.multiplier.interval or [e.multiplier.value])]
    fig.update_xaxes(
        type="log",
        title_text=f"effective-compute multiplier to {effects.full} (×, ratio; {conv})",
        range=theme.log_range(values, pad=0.05),
    )
    fig.update_yaxes(categoryorder="array", categoryarray=labels)
    theme.base_layout(
        fig, f"What each component is worth to {effects.full} ({conv})", height=120 + 32 * len(rows)
    )
    return Panel(
        key=f"components-{conv}",
        figure=fig,
        caption=_caption(effects),
        note=COMPONENT_NOTE.format(full=effects.full),
    )


def _caption(effects: ComponentEffects) -> str:
    identified = [e for e in effects.effects.values() if e.multiplier.identified]
    control = effects.effects.get(effects.positive_control)
    parts = [f"{len(identified)} of {len(effects.effects)} multipliers identified"]
    if control is not None:
        m = control.multiplier
        said = (
            f"{theme.fmt_num(m.value)} {_interval(m.interval)}"
            if m.identified
            else f"not identified ({m.verdict.reason})"
        )
        parts.append(f"positive control {control.arm}: M = {said}")
    if effects.sum_check:
        parts.append(sum_text(effects.sum_check, effects.full, effects.convention))
    return "; ".join(parts) + ". Diamonds: published anchors at far larger scale."
