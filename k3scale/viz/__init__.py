"""k3scale.viz: plotly figures and offline HTML dashboards of a study's run tables and fits.

Builders (`curves`, `trunks`, `landscape`, `lr_sweep`, `hp`, `frontier`, `schedules`, `isoflop`,
`surface`, `overview`) take the run tables (INTERFACES.md section 9) and `fits.DashboardFits`
(the records of the `k3scale fit` artifact, read by k3scale/scaling/values/fitdoc.py) and return a
`panel.Panel` (a plotly Figure plus its one-line caption); they do no I/O and fit nothing: every
fitted quantity drawn is the artifact's, the one the report prints. `dashboard` runs a layout
from `dashboards/`, `page` renders the self-contained HTML, `export_png` writes PNGs via
kaleido. Nothing here imports torch or Ray.
"""
