"""Dashboard of the K3-style vs K2-style study (experiments/k2_vs_k3.py).

Order: what was run; the headline compute multiplier of K3 over K2 under both FLOP counts
(methods.md 2.8); the frontiers it comes from; loss vs LR per cell with both archs on one axis;
tuned optima vs compute; curves and landscapes behind the optima; IsoFLOP and Chinchilla views.
"""

from k3scale.viz import frontier, hp, overview
from k3scale.viz.dashboard import (
    DashboardInputs,
    PanelList,
    add_curves_and_landscapes,
    add_lr_sweeps,
    add_surfaces,
)

TITLE = "K3-style vs K2-style: compute multiplier at matched loss"
ARCHS = ("k2", "k3")


def panels(inputs: DashboardInputs, page: PanelList) -> None:
    page.add(overview.overview_panel, inputs.runs)
    for conv, base, new in inputs.fits.multipliers():
        if {base, new} == set(ARCHS):
            page.add(frontier.multiplier_panel, inputs.fits, conv, new)
    for compute in ("c_6n", "c_attn"):
        page.add(frontier.frontier_panel, inputs.runs, inputs.fits, inputs.metric, compute)
    add_lr_sweeps(inputs, page, "arch", "k2")
    page.add(hp.hp_optima_panel, inputs.fits)
    add_curves_and_landscapes(inputs, page)
    add_surfaces(inputs, page)
