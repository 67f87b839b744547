"""The ablation study's forest plot: one row per component, its loss difference to the full model
with its 95% interval and, where the full model's frontier prices it, its effective-compute
multiplier beside the published anchor (issue 38).

The loss difference is what every arm is measured in first; a multiplier needs the full model's
frontier to convert it into compute, and that frontier may not reach every cell (issue 47): an
arm without a multiplier keeps its loss row, and the caption says why it has no multiplier.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from k3scale.errors import K3ScaleError
from k3scale.scaling.component_text import signed_loss, sum_text
from k3scale.scaling.values.components import ComponentEffect, ComponentEffects
from k3scale.scaling.values.text import diff_text
from k3scale.scaling.values.uncertainty import Estimate
from k3scale.viz import theme
from k3scale.viz.fits import DashboardFits
from k3scale.viz.panel import Panel

IDENTIFIED_COLOUR = "#d62728"
NOT_IDENTIFIED_COLOUR = "#999999"
ANCHOR_COLOUR = "#1f77b4"
LOSS_NOTE = (
    "Sign convention: a loss difference is arm − {full}, so a positive value means {full}, with "
    "the component, reaches the lower loss."
)
MULTIPLIER_NOTE = (
    " Ratio convention: M = the compute {full} would need without the component over the compute "
    "it needs with it, at matched rung and tokens; M > 1 means the component is worth that "
    "factor of compute to {full}."
)


def _rows(effects: ComponentEffects) -> list[ComponentEffect]:
    """Components by loss difference, then the positive control, then the whole gap at the top."""
    control = effects.positive_control
    gap = effects.sum_check.against if effects.sum_check else None
    parts = [e for e in effects.effects.values() if e.arm not in (control, gap)]
    parts.sort(key=lambda e: signed_loss(e).value if signed_loss(e).value is not None else -1e9)
    ends = [effects.effects[a] for a in (control, gap) if a in effects.effects]
    return parts + ends


def _label(effect: ComponentEffect, effects: ComponentEffects) -> str:
    if effect.arm == effects.positive_control:
        return f"{effect.arm} (positive control)"
    if effects.sum_check and effect.arm == effects.sum_check.against:
        return f"{effects.full} over {effect.arm} (the whole gap)"
    return effect.arm


def _hover(effect: ComponentEffect, full: str) -> str:
    m, loss = effect.multiplier, signed_loss(effect)
    parts = [effect.note, f"loss {effect.arm} − {full}: {diff_text(loss)}"]
    parts.append(f"M {theme.fmt_num(m.value)} {_interval(m.interval)}: {m.verdict.to_json()}")
    if effect.anchor:
        parts.append(f"anchor: {effect.anchor.text} ({effect.anchor.source})")
    return "<br>".join(parts)


def _interval(ci: list | None) -> str:
    return theme.fmt_interval(*ci) if ci else "[no interval]"


def _drawn(e: Estimate) -> bool:
    """An identified value with an interval to draw."""
    return e.identified and e.value is not None and bool(e.interval)


def _points(
    rows: list[tuple[str, ComponentEffect, Estimate]], name: str, full: str, identified: bool
) -> go.Scatter:
    """Estimates as markers on their rows: filled with 95% bars, or hollow without bars."""
    estimates = [e for _, _, e in rows]
    up = [e.interval[1] - e.value if identified else None for e in estimates]
    down = [e.value - e.interval[0] if identified else None for e in estimates]
    colour = IDENTIFIED_COLOUR if identified else NOT_IDENTIFIED_COLOUR
    return go.Scatter(
        x=[e.value for e in estimates],
        y=[label for label, _, _ in rows],
        mode="markers",
        marker=theme.estimate_marker(colour, "circle", [identified] * len(rows), size=9),
        error_x={
            "type": "data",
            "symmetric": False,
            "array": up,
            "arrayminus": down,
            "visible": identified,
        },
        name=name,
        hovertext=[_hover(effect, full) for _, effect, _ in rows],
        hoverinfo="text",
    )


def _loss_traces(labels: list[str], rows: list[ComponentEffect], full: str) -> list[go.Scatter]:
    traces = []
    for identified, name in ((True, "loss difference [95%]"), (False, "loss, not identified")):
        mine = [
            (label, e, signed_loss(e))
            for label, e in zip(labels, rows, strict=True)
            if signed_loss(e).value is not None and _drawn(signed_loss(e)) == identified
        ]
        if mine:
            traces.append(_points(mine, name, full, identified))
    return traces


def _anchor_trace(anchored: list[tuple[str, ComponentEffect]]) -> go.Scatter:
    return go.Scatter(
        x=[e.anchor.multiplier for _, e in anchored],
        y=[label for label, _ in anchored],
        mode="markers",
        marker={"symbol": "diamond-open", "size": 11, "color": ANCHOR_COLOUR},
        name="published anchor",
        hovertext=[f"{e.anchor.text} ({e.anchor.source})" for _, e in anchored],
        hoverinfo="text",
    )


def forest_panel(fits: DashboardFits, conv: str) -> Panel:
    """Each component's loss difference arm − full [95%]; beside it, for the arms whose
    multiplier is identified, the multiplier [95%] with its published anchor; then the positive
    control and the whole gap."""
    effects = fits.component_effects.get(conv)
    if effects is None or effects.skipped or not effects.effects:
        why = effects.skipped if effects else "the fit has no component effects"
        raise K3ScaleError(f"dashboard: component effects ({conv}) not drawn: {why}")
    rows, full = _rows(effects), effects.full
    if all(signed_loss(e).value is None for e in rows):
        reasons = sorted(
            {signed_loss(e).verdict.reason for e in rows if signed_loss(e).verdict.reason}
        )
        # The page lists this line where the figure would be: no axis for numbers not known.
        raise K3ScaleError(
            f"dashboard: component effects ({conv}) not drawn: no loss difference is defined "
            f"({'; '.join(reasons)})"
        )
    labels = [_label(e, effects) for e in rows]
    priced = [(label, e) for label, e in zip(labels, rows, strict=True) if _drawn(e.multiplier)]
    fig = make_subplots(rows=1, cols=2 if priced else 1, shared_yaxes=True, horizontal_spacing=0.03)
    for trace in _loss_traces(labels, rows, full):
        fig.add_trace(trace, row=1, col=1)
    fig.add_vline(x=0.0, line={"color": "#999999", "width": 1}, row=1, col=1)
    fig.update_xaxes(
        title_text=f"loss arm − {full} ({theme.LOSS_UNIT}; > 0: the component lowers the loss)",
        row=1,
        col=1,
    )
    if priced:
        _add_multipliers(fig, priced, full, conv)
    fig.update_yaxes(categoryorder="array", categoryarray=labels)
    theme.base_layout(
        fig, f"What each component is worth to {full} ({conv})", height=140 + 32 * len(rows)
    )
    fig.update_layout(legend={"orientation": "h", "x": 0.0, "y": -0.12, "yanchor": "top"})
    note = LOSS_NOTE + (MULTIPLIER_NOTE if priced else "")
    return Panel(
        key=f"components-{conv}",
        figure=fig,
        caption=_caption(effects, rows, priced),
        note=note.format(full=full),
    )


def _add_multipliers(
    fig: go.Figure, priced: list[tuple[str, ComponentEffect]], full: str, conv: str
) -> None:
    """The right panel: identified multipliers [95%] and the anchors of those arms (log axis)."""
    fig.add_trace(
        _points([(label, e, e.multiplier) for label, e in priced], "multiplier [95%]", full, True),
        row=1,
        col=2,
    )
    anchored = [(label, e) for label, e in priced if e.anchor and e.anchor.multiplier]
    if anchored:
        fig.add_trace(_anchor_trace(anchored), row=1, col=2)
    fig.add_vline(x=1.0, line={"color": "#999999", "width": 1}, row=1, col=2)
    values = [1.0] + [e.anchor.multiplier for _, e in anchored]
    values += [v for _, e in priced for v in e.multiplier.interval]
    fig.update_xaxes(
        type="log",
        title_text=f"effective-compute multiplier to {full} (×, ratio; {conv})",
        range=theme.log_range(values, pad=0.05),
        row=1,
        col=2,
    )


def _missing_multipliers(effects: ComponentEffects, rows: list[ComponentEffect]) -> str:
    """Which arms have no multiplier drawn, grouped by their reason."""
    why: dict[str, list[str]] = {}
    for e in rows:
        if not _drawn(e.multiplier):
            reason = e.multiplier.verdict.reason or "no interval"
            why.setdefault(reason, []).append(e.arm)
    if not why:
        return ""
    if all(not _drawn(e.multiplier) for e in rows):
        head = f"no arm's multiplier to {effects.full} is identified, so none is drawn"
        if len(why) == 1:
            return f"{head} ({next(iter(why))})"
        return f"{head}: " + "; ".join(f"{', '.join(arms)}: {r}" for r, arms in why.items())
    return "no multiplier for " + "; ".join(f"{', '.join(arms)} ({r})" for r, arms in why.items())


def _caption(
    effects: ComponentEffects,
    rows: list[ComponentEffect],
    priced: list[tuple[str, ComponentEffect]],
) -> str:
    full, num = effects.full, len(rows)
    seen = sum(_drawn(signed_loss(e)) for e in rows)
    parts = [
        f"loss arm − {full} (mean over cells, on the re-run seeds that did not choose the "
        f"cells' points where each arm has them, else over all seeds; bars: 95% interval; "
        f"hollow: not identified): identified for {seen} of {num} arms"
    ]
    if priced:
        parts.append(
            f"multiplier M to {full} (right; bars: 95% interval): identified for "
            f"{len(priced)} of {num} arms"
        )
    missing = _missing_multipliers(effects, rows)
    if missing:
        parts.append(missing)
    control = effects.effects.get(effects.positive_control)
    if control is not None:
        m = control.multiplier
        said = f"positive control {control.arm}: loss {diff_text(signed_loss(control))} nats"
        if _drawn(m):
            said += f", M = {theme.fmt_num(m.value)} {_interval(m.interval)}"
        parts.append(said)
    if effects.sum_check:
        parts.append(sum_text(effects.sum_check, full, effects.convention))
    anchored = [e for e in rows if e.anchor and e.anchor.multiplier]
    shown = {e.arm for _, e in priced}
    unshown = [f"{e.arm} {e.anchor.multiplier:g}x" for e in anchored if e.arm not in shown]
    if unshown:
        parts.append(
            f"published anchors of arms without a multiplier (not drawn): {', '.join(unshown)}"
        )
    tail = (
        " Diamonds: published anchors at far larger scale." if len(unshown) < len(anchored) else ""
    )
    return "; ".join(parts) + "." + tail
