"""Dashboard of the cosine vs WSD study (experiments/cosine_vs_wsd.py).

Order: what was run; the headline comparison (each schedule at its own tuned optimum, and the
shared setting beside it); loss vs LR per cell with both schedules on one axis; where the optima
sit and how they move with compute; loss curves of every run, WSD trunks with their branches and
the landscapes behind the optima; frontiers per schedule; IsoFLOP and Chinchilla views.
"""

from k3scale.viz import frontier, hp, overview, schedules
from k3scale.viz.dashboard import (
    DashboardInputs,
    PanelList,
    add_curves_and_landscapes,
    add_lr_sweeps,
    add_surfaces,
)

# {tuned}: what the runs tuned (k3scale/viz/summaries.py `tuned_text`): on an LR grid batch is
# fixed, and the title must not say it was tuned.
TITLE = "Cosine vs WSD at per-schedule tuned {tuned}, fixed lr_min"


def panels(inputs: DashboardInputs, page: PanelList) -> None:
    page.add(overview.overview_panel, inputs.runs)
    page.add(schedules.schedule_comparison_panel, inputs.fits)
    add_lr_sweeps(inputs, page, "schedule", "cosine")
    page.add(hp.hp_optima_panel, inputs.fits)
    add_curves_and_landscapes(inputs, page)
    page.add(frontier.frontier_panel, inputs.runs, inputs.fits, inputs.metric, "c_6n")
    for conv, base, new in inputs.fits.multipliers():
        if {base, new} == {"cosine", "wsd"}:
            page.add(frontier.multiplier_panel, inputs.fits, conv, new)
    add_surfaces(inputs, page)
