"""Colours, axis titles with units and the common layout of every dashboard figure.

One colour per architecture and one dash/symbol per schedule, so a reader can match traces
across figures. Axis titles always carry units (style.md: units on every axis).
"""

from __future__ import annotations

import math

import plotly.graph_objects as go

ARCH_COLOURS = {"k2": "#1f77b4", "k3": "#d62728"}
SCHEDULE_COLOURS = {"cosine": "#2ca02c", "wsd": "#9467bd"}
SCHEDULE_DASH = {"cosine": "solid", "wsd": "dash"}
SCHEDULE_SYMBOL = {"cosine": "circle", "wsd": "diamond"}
# The compute-optimal routes of k3scale/scaling/estimates/compute_optimal.py: one line style each on
# the frontier figure, one colour each on the multiplier figure (where the arm is fixed). No route
# takes an arch's or a schedule's colour: a cosine-over-WSD multiplier in cosine's green would read
# as cosine's own line.
ROUTE_DASH = {
    "surface": "solid",
    "envelope": "dash",
    "envelope_e0": "dashdot",
    "monotone": "longdash",
}
DASH_WORDS = {
    "solid": "solid",
    "dash": "dashed",
    "dashdot": "dash-dotted",
    "longdash": "long-dashed",
}
ROUTE_COLOURS = {
    "surface": "#ff7f0e",
    "envelope": "#17becf",
    "envelope_e0": "#e377c2",
    "monotone": "#8c564b",
}
ROUTE_SYMBOL = {
    "surface": "circle",
    "envelope": "square",
    "envelope_e0": "triangle-up",
    "monotone": "diamond",
}
UNIDENTIFIED_DASH = "dot"
STATUS_COLOURS = {"finished": "#2ca02c", "diverged": "#ff7f0e", "failed": "#7f7f7f"}
FALLBACK_COLOUR = "#444444"

METRIC_LABELS = {
    "final_val_ood_loss": "final val OOD loss",
    "final_val_id_loss": "final val ID loss",
    "final_train_loss": "final train loss",
    "train/loss": "train loss",
    "val/id_loss": "val ID loss",
    "val/ood_loss": "val OOD loss",
}
COMPUTE_LABELS = {
    "c_6n": "training compute C = 6·N_active·D (FLOPs)",
    "c_attn": "training compute C = (6·N_active + attention)·D (FLOPs)",
}
LOSS_UNIT = "nats/token"
LR_TITLE = "peak learning rate (per step, dimensionless)"
BATCH_TITLE = "batch size (sequences/step)"
BATCH_TOKENS_TITLE = "batch size (tokens/step)"
PARAMS_TITLE = "active parameters N (parameters)"
TOKENS_TITLE = "tokens seen (tokens)"
# One sign convention for every difference and ratio, the one `k3scale fit` and `report` print
# (k3scale/scaling/estimates/schedule_compare.py: diff = L_reference - L_other).
DIFF_NOTE = (
    "Sign convention: a difference is reference − other ({ref} − {other}), so a negative value "
    "means {ref} reaches the lower loss."
)
RATIO_NOTE = (
    "Ratio convention: other / reference ({other} / {ref}); 1 means equal, above 1 means "
    "{other}'s value is the larger."
)
MULTIPLIER_NOTE = (
    "Ratio convention: M = C_{ref}(L_{other}(C)) / C, the compute {ref} needs to match "
    "{other}'s loss over the compute {other} used; M > 1 means {other} needs less compute."
)
FIGURE_HEIGHT = 420
GRID_COLOUR = "#e5ecf6"
# A small white template: plotly's "plotly_white" is deep-copied into every figure it styles,
# which costs ~0.1 s per figure; this carries only what the dashboards need.
# "power" ticks read 10^-3 on log axes, never the SI "100p" or "10B" plotly defaults to.
_AXIS = {
    "gridcolor": GRID_COLOUR,
    "linecolor": GRID_COLOUR,
    "zerolinecolor": GRID_COLOUR,
    "exponentformat": "power",
}
TEMPLATE = {
    "layout": {
        "paper_bgcolor": "white",
        "plot_bgcolor": "white",
        "font": {"color": "#2a3f5f"},
        "xaxis": {**_AXIS, "automargin": True},
        "yaxis": {**_AXIS, "automargin": True},
        "hovermode": "closest",
    }
}


def estimate_marker(colour: str, symbol: str, identified: list[bool], size: int = 11) -> dict:
    """Markers of estimates: filled where identified, open where not (every figure's rule)."""
    return {
        "color": colour,
        "size": size,
        "symbol": [symbol + ("" if ok else "-open") for ok in identified],
        "line": {"color": colour, "width": 2},
    }


def loss_title(metric: str) -> str:
    """'final val OOD loss (nats/token)' for a metric or run-table column."""
    return f"{METRIC_LABELS.get(metric, metric)} ({LOSS_UNIT})"


def compute_title(compute_key: str) -> str:
    return COMPUTE_LABELS.get(compute_key, f"{compute_key} (FLOPs)")


def base_layout(fig: go.Figure, title: str, height: int = FIGURE_HEIGHT) -> go.Figure:
    """Title, white template, legend on the right, fixed height; returns `fig`."""
    fig.update_layout(
        title={"text": title, "x": 0.01},
        template=TEMPLATE,
        height=height,
        margin={"l": 70, "r": 20, "t": 60, "b": 60},
        legend={"font": {"size": 11}},
    )
    return fig


def fmt_sci(value: float, digits: int = 2) -> str:
    """3.1e+17 -> '3.1e17'; NaN -> 'n/a'."""
    if value is None or not math.isfinite(value):
        return "n/a"
    mantissa, exponent = f"{value:.{digits - 1}e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def fmt_num(value: float, digits: int = 3) -> str:
    """Compact number with `digits` significant digits; NaN -> 'n/a'."""
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:.{digits}g}"


def fmt_interval(lo: float, hi: float, digits: int = 3) -> str:
    return f"[{fmt_num(lo, digits)}, {fmt_num(hi, digits)}]"


def group_style(arch: str, schedule: str, multi_arch: bool) -> dict[str, str]:
    """Colour by arch when several archs share the figure, else by schedule; dash by schedule."""
    colour = ARCH_COLOURS.get(arch) if multi_arch else SCHEDULE_COLOURS.get(schedule)
    return {
        "colour": colour or FALLBACK_COLOUR,
        "dash": SCHEDULE_DASH.get(schedule, "dot"),
        "symbol": SCHEDULE_SYMBOL.get(schedule, "square"),
        "name": f"{arch} {schedule}",
    }


def arm_colour(arm: str) -> str:
    """Colour of an arm that is an architecture or a schedule."""
    return ARCH_COLOURS.get(arm) or SCHEDULE_COLOURS.get(arm) or FALLBACK_COLOUR


# Colours for arms that are neither an arch nor a schedule (the ablation's variants), none of
# them an arch's, a schedule's, a route's or a status colour (issue 51: ten of twelve arms were
# drawn in the fallback grey).
VARIANT_PALETTE = (
    "#1b9e77",
    "#d95f02",
    "#7570b3",
    "#e7298a",
    "#66a61e",
    "#e6ab02",
    "#a6761d",
    "#0b3c5d",
    "#6a3d9a",
    "#01665e",
    "#c51b7d",
    "#b15928",
    "#4d9221",
    "#5e3c99",
)


def arm_colours(arms: list[str]) -> dict[str, str]:
    """One distinct colour per arm of a figure: archs and schedules keep theirs, the other arms
    take the variant palette in sorted order (the fallback grey once it runs out)."""
    out = {arm: arm_colour(arm) for arm in arms if arm_colour(arm) != FALLBACK_COLOUR}
    others = sorted(arm for arm in arms if arm not in out)
    for i, arm in enumerate(others):
        out[arm] = VARIANT_PALETTE[i] if i < len(VARIANT_PALETTE) else FALLBACK_COLOUR
    return out


def log_range(values, pad: float = 0.05) -> list[float]:
    """log10 axis range spanning the positive finite `values`, `pad` decades either side."""
    finite = [math.log10(v) for v in values if v is not None and math.isfinite(v) and v > 0]
    return [min(finite) - pad, max(finite) + pad]


def linear_range(values, pad: float = 0.05) -> list[float]:
    """Axis range spanning the finite `values` with `pad` of their span (or of |value|) either side."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    lo, hi = min(finite), max(finite)
    margin = pad * ((hi - lo) or abs(hi) or 1.0)
    return [lo - margin, hi + margin]


def band_fill(colour: str, alpha: float = 0.18) -> str:
    """'#rrggbb' -> 'rgba(r,g,b,alpha)' for a confidence band."""
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"
