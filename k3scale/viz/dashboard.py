"""Dashboard layouts: which panels, in what order, for a study.

A layout is a Python file in `dashboards/` (e.g. `dashboards/cosine_vs_wsd.py`) that defines
`TITLE: str` and `panels(inputs: DashboardInputs, page: PanelList) -> None`, adding panels with
`page.add(builder, *args)`. A builder that finds the data cannot support its figure raises
K3ScaleError; `PanelList.add` records that as a skipped-panel note shown in the page header
instead of failing the whole page. `generic_panels` is the layout used when a study has none.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from k3scale.errors import K3ScaleError
from k3scale.viz import (
    components,
    curves,
    frontier,
    hp,
    isoflop,
    landscape,
    lr_sweep,
    overview,
    schedules,
    seeds,
    surface,
    trunks,
)
from k3scale.viz.fits import DashboardFits
from k3scale.viz.panel import Panel
from k3scale.viz.summaries import require_columns

DEFAULT_METRIC = "final_val_ood_loss"
# The project's layouts (issue 23: never a dashboards/ folder in the current directory).
PROJECT_LAYOUTS = Path(__file__).resolve().parents[2] / "dashboards"
_LAYOUT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")


@dataclass(frozen=True, kw_only=True)
class DashboardInputs:
    runs: pl.DataFrame
    """Run table (INTERFACES.md section 9)."""
    curves: pl.DataFrame
    """Curve table (`run_id, step, tokens, metric, value`)."""
    fits: DashboardFits
    """What the fit artifact holds (empty when no fit file was given)."""
    metric: str = DEFAULT_METRIC
    """Run-table column every figure treats as the objective."""

    def groups(self) -> list[tuple[str, str]]:
        """(arch, schedule) pairs present, sorted."""
        return sorted(self.runs.select("arch", "schedule").unique().rows())

    def archs(self) -> list[str]:
        return sorted(self.runs["arch"].unique().to_list())

    def schedules(self) -> list[str]:
        return sorted(self.runs["schedule"].unique().to_list())


@dataclass
class PanelList:
    """Panels in page order, and notes on panels the data could not support."""

    panels: list[Panel] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def add(self, builder: Callable[..., Panel], *args, **kwargs) -> None:
        try:
            self.panels.append(builder(*args, **kwargs))
        except K3ScaleError as exc:
            self.skipped.append(str(exc).removeprefix("dashboard: "))


def add_curves_and_landscapes(inputs: DashboardInputs, page: PanelList) -> None:
    """Every run's curves (a cell menu), WSD trunks with branches, every (arch, schedule) landscape."""
    page.add(curves.training_curves_panel, inputs.runs, inputs.curves, inputs.metric)
    page.add(seeds.seed_noise_panel, inputs.runs, inputs.metric)
    if "wsd" in inputs.schedules():
        page.add(trunks.wsd_branches_panel, inputs.runs, inputs.curves, inputs.metric)
    for arch, schedule in inputs.groups():
        page.add(landscape.lr_batch_landscape_panel, inputs.runs, arch, schedule, inputs.metric)


def add_lr_sweeps(inputs: DashboardInputs, page: PanelList, arm_key: str, reference: str) -> None:
    """Loss vs LR per design cell with both arms on one axis (per-arm tuning made visible), once
    per value of the key the arms share (the arch when arms are schedules, and vice versa)."""
    shared = inputs.archs() if arm_key == "schedule" else inputs.schedules()
    for fixed in shared:
        page.add(lr_sweep.lr_sweep_panel, inputs.runs, arm_key, reference, fixed, inputs.metric)


def add_surfaces(inputs: DashboardInputs, page: PanelList) -> None:
    """IsoFLOP views (loss vs N at fixed C) per arch, as `k3scale fit` fits them, then Chinchilla
    views (loss vs N at fixed D) per (arch, schedule)."""
    for arch in inputs.archs():
        page.add(isoflop.isoflop_panel, inputs.fits, arch)
    for arch, schedule in inputs.groups():
        page.add(surface.surface_panel, inputs.fits, arch, schedule)


def generic_panels(inputs: DashboardInputs, page: PanelList) -> None:
    """Every figure the data supports: overview, frontiers, comparisons, HP, curves, surfaces."""
    page.add(overview.overview_panel, inputs.runs)
    for compute in ("c_6n", "c_attn"):
        page.add(frontier.frontier_panel, inputs.runs, inputs.fits, inputs.metric, compute)
    for conv, _, new in inputs.fits.multipliers():
        page.add(frontier.multiplier_panel, inputs.fits, conv, new)
    for conv in inputs.fits.component_effects:
        page.add(components.forest_panel, inputs.fits, conv)
    if {"cosine", "wsd"} <= set(inputs.schedules()):
        page.add(schedules.schedule_comparison_panel, inputs.fits)
        add_lr_sweeps(inputs, page, "schedule", "cosine")
    page.add(hp.hp_optima_panel, inputs.fits)
    add_curves_and_landscapes(inputs, page)
    add_surfaces(inputs, page)


@dataclass(frozen=True)
class Layout:
    title: str
    build: Callable[[DashboardInputs, PanelList], None]
    source: str
    """File the layout came from, or 'generic'."""


GENERIC = Layout("k3scale study dashboard", generic_panels, "generic")


def load_layout(name_or_path: str | None, study: str) -> Layout:
    """A layout by .py file path, by name in the project's dashboards/, or the study's own there.

    Layouts are code, so a name is looked up only in `PROJECT_LAYOUTS`, never in the current
    directory, and must be a plain file name: a study name read out of a run table (such as
    `../evil`) that is not one, or has no layout, gets GENERIC.

    Args:
        name_or_path: explicit layout ("k2_vs_k3" or "path/to/layout.py"); None = the study's.
        study: study name (the runs' `study` column), used when `name_or_path` is None.

    Raises:
        K3ScaleError: an explicit layout that does not exist or cannot be loaded.
    """
    if name_or_path and name_or_path.endswith(".py"):
        return _import_layout(Path(name_or_path))
    name = name_or_path or study
    path = PROJECT_LAYOUTS / f"{name}.py"
    if _LAYOUT_NAME.fullmatch(name) and path.is_file():
        return _import_layout(path)
    if name_or_path:
        known = ", ".join(sorted(p.stem for p in PROJECT_LAYOUTS.glob("*.py")))
        raise K3ScaleError(
            f"dashboard: no layout {name_or_path!r} in {PROJECT_LAYOUTS} (known: {known}); "
            "or pass a .py file"
        )
    return GENERIC


def _import_layout(path: Path) -> Layout:
    if not path.is_file():
        raise K3ScaleError(f"dashboard: layout file {path} does not exist")
    spec = importlib.util.spec_from_file_location(f"k3scale_layout_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise K3ScaleError(
            f"dashboard: layout {path} cannot be loaded: {type(exc).__name__}: {exc}"
        ) from None
    if not callable(getattr(module, "panels", None)) or not isinstance(
        getattr(module, "TITLE", None), str
    ):
        raise K3ScaleError(f"dashboard: layout {path} must define TITLE and panels(inputs, page)")
    return Layout(module.TITLE, module.panels, str(path))


def build_panels(layout: Layout, inputs: DashboardInputs) -> PanelList:
    """Run the layout over the inputs; raises if no panel at all could be built."""
    require_columns(inputs.runs, (inputs.metric,), "the run table")
    page = PanelList()
    layout.build(inputs, page)
    if not page.panels:
        raise K3ScaleError(
            "dashboard: no figure could be built: " + ("; ".join(page.skipped) or "empty layout")
        )
    keys = [p.key for p in page.panels]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise K3ScaleError(f"dashboard: layout {layout.source} adds {', '.join(repeated)} twice")
    return page
