"""Dashboard of the component ablation study (experiments/k3_ablations.py).

Order: what was run; the forest plot of what each component is worth to full K3 under both FLOP
counts, with the published anchors, the positive control and the whole K3-over-K2 gap; loss vs
LR per cell with every arm against K3; tuned optima vs compute; curves and landscapes.
"""

from k3scale.viz import components, hp, overview
from k3scale.viz.dashboard import (
    DashboardInputs,
    PanelList,
    add_curves_and_landscapes,
    add_lr_sweeps,
)

TITLE = "K3's gain apportioned: each component switched back, tuned per cell on shared seeds"


def panels(inputs: DashboardInputs, page: PanelList) -> None:
    page.add(overview.overview_panel, inputs.runs)
    for conv in ("c_6n", "c_attn"):
        page.add(components.forest_panel, inputs.fits, conv)
    add_lr_sweeps(inputs, page, "arch", "k3")
    page.add(hp.hp_optima_panel, inputs.fits)
    add_curves_and_landscapes(inputs, page)
