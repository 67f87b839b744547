"""Figure builders added for issue 21: IsoFLOP minima (as `k3scale fit` stores them), LR sweeps of both arms, WSD trunks with
branches, and the conventions every difference and ratio figure states. Fast (no browser)."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from k3scale.errors import K3ScaleError
from k3scale.scaling.estimates.compute_optimal import ROUTES
from k3scale.viz import frontier, isoflop, lr_sweep, overview, theme, trunks
from k3scale.viz.fits import DashboardFits
from k3scale.viz.summaries import best_trials
from tests.viz.fit_fixture import fit_artifact
from tests.viz.make_fixture import make_isoflop_tables

METRIC = "final_val_ood_loss"
COMMITTED = Path(__file__).resolve().parents[2] / "analysis" / "results"


@pytest.fixture(scope="module")
def isoflop_artifact() -> dict:
    """`k3scale fit k2_vs_k3` of one arch tuned on an IsoFLOP grid (make_fixture.py)."""
    return fit_artifact("k2_vs_k3", *make_isoflop_tables())


def test_isoflop_marks_the_minima_the_fit_stored(isoflop_artifact):
    fits = DashboardFits.from_artifact(isoflop_artifact)
    panel = isoflop.isoflop_panel(fits, "k2", "c_6n")
    stored = isoflop_artifact["results"]["per_arch"]["k2"]["isoflop"]["c_6n"]
    minima = stored["extra"]["minima"]
    (stars,) = [t for t in panel.figure.data if t.name.startswith("minima of")]
    assert list(stars.x) == [m["n_opt"] for m in minima]
    assert list(stars.y) == [m["loss_opt"] for m in minima]
    assert list(stars.marker.symbol) == ["star" if m["used"] else "star-open" for m in minima]
    assert {m["used"] for m in minima} == {True, False}
    # Levels as the fit groups cells: one per stored minimum, each drawn in its own colour.
    levels = [t for t in panel.figure.data if t.name.startswith("C = ")]
    assert len(levels) == len(minima) == 4
    assert [level.marker.color for level in levels] == list(stars.marker.color)
    assert f"a = {stored['params']['exp_C']:.3f}" in panel.caption
    assert "4 compute levels" in panel.caption
    lo, hi = panel.figure.layout.xaxis.range
    assert 10**lo >= 15_000 / 1.2 and 10**hi <= 15_360_000 * 1.2


def test_isoflop_without_a_fit_says_why(isoflop_artifact, fits):
    doc = copy.deepcopy(isoflop_artifact)
    doc["results"]["per_arch"]["k2"]["isoflop"]["c_6n"] = {"skipped": "too few budgets"}
    panel = isoflop.isoflop_panel(DashboardFits.from_artifact(doc), "k2", "c_6n")
    assert not [t for t in panel.figure.data if t.name.startswith("minima of")]
    assert "skipped the fit: too few budgets" in panel.caption
    del doc["results"]["per_arch"]
    panel = isoflop.isoflop_panel(DashboardFits.from_artifact(doc), "k2", "c_6n")
    assert "holds no IsoFLOP fit of k2" in panel.caption


def test_isoflop_on_a_grid_without_shared_compute_is_a_skip_note(fits):
    one_budget = replace(
        fits, cell_optima=tuple(o for o in fits.cell_optima if o.cell["budget_tokens"] == 131_072)
    )
    with pytest.raises(K3ScaleError, match=r"no IsoFLOP view of k3: .* holds two or more sizes"):
        isoflop.isoflop_panel(one_budget, "k3")


def test_fixture_levels_pair_sizes_without_a_fit(fits):
    # t1 at the largest budget and t2 at the smallest share a compute level; two sizes are not
    # enough for a minimum, and the caption says why the fit gives none.
    panel = isoflop.isoflop_panel(fits, "k3")
    levels = [t for t in panel.figure.data if t.name.startswith("C = ")]
    assert levels and all(len(t.x) == 2 for t in levels)
    assert {t.name.rsplit(", ", 1)[1] for t in levels} == {"cosine", "wsd"}
    assert "skipped the fit" in panel.caption


def test_lr_sweep_overlays_both_schedules_and_marks_the_shared_setting(runs):
    panel = lr_sweep.lr_sweep_panel(runs, "schedule", "cosine", "k3", METRIC)
    part = runs.filter(pl.col("arch") == "k3")
    optima = best_trials(part, METRIC)
    best = [t for t in panel.figure.data if t.name.endswith("best (open: at an LR edge)")]
    assert len(best) == optima.height
    assert sorted(t.x[0] for t in best) == sorted(optima["lr"].to_list())
    shared = [t for t in panel.figure.data if t.name.endswith("(shared setting)")]
    assert sum(len(t.x) for t in shared) == part.filter(pl.col("arm") == "shared").height
    # The shared setting is cosine's best LR: one dotted line per cell.
    lines = [s for s in panel.figure.layout.shapes if s.line.dash == "dot"]
    assert sorted(s.x0 for s in lines) == sorted(
        optima.filter(pl.col("schedule") == "cosine")["lr"].to_list()
    )
    assert "median best-trial LR wsd/cosine" in panel.caption
    assert "Ratio convention" in panel.note


def test_lr_sweep_of_archs_shares_design_cells(runs):
    panel = lr_sweep.lr_sweep_panel(runs, "arch", "k2", "cosine", METRIC)
    names = {t.name.split()[0] for t in panel.figure.data if "best" in t.name}
    assert names == {"k2", "k3"}
    assert "over 9 cells" in panel.caption


def test_lr_sweep_of_many_arms_gives_each_its_own_colour():
    """The ablation's twelve arms (issue 51: ten of them in one grey, the title cut mid-name)."""
    runs = pl.read_parquet(COMMITTED / "k3_ablations-cpu" / "runs.parquet")
    schedule = runs["schedule"].drop_nulls()[0]
    panel = lr_sweep.lr_sweep_panel(runs, "arch", "k3", schedule, METRIC)
    colour = {}
    for t in panel.figure.data:
        if t.name.endswith("best (open: at an LR edge)"):
            colour.setdefault(t.name.split()[0], set()).add(t.marker.color)
    assert len(colour) == runs["arch"].n_unique() >= 10
    assert all(len(c) == 1 for c in colour.values())  # one colour per arm in every cell
    drawn = [next(iter(c)) for c in colour.values()]
    assert len(set(drawn)) == len(drawn) and theme.FALLBACK_COLOUR not in drawn
    assert panel.figure.layout.title.text.endswith(f"{len(colour)} arms against k3")


def test_seed_noise_draws_k3_on_top_of_the_variants_each_in_its_colour():
    from k3scale.viz.seeds import seed_noise_panel

    runs = pl.read_parquet(COMMITTED / "k3_ablations-cpu" / "runs.parquet")
    traces = seed_noise_panel(runs, METRIC).figure.data
    colours = [t.marker.color for t in traces]
    assert len(set(colours)) == len(colours) == runs["arch"].n_unique()
    assert traces[-1].name in ("k2", "k3") and traces[-2].name in ("k2", "k3")


@pytest.fixture(scope="module")
def wsd_study():
    folder = COMMITTED / "cosine_vs_wsd-cpu"
    return pl.read_parquet(folder / "runs.parquet"), pl.read_parquet(folder / "curves.parquet")


def test_wsd_branches_continue_their_trunk(wsd_study):
    runs, curves = wsd_study
    panel = trunks.wsd_branches_panel(runs, curves, METRIC)
    fig = panel.figure
    branches = runs.filter(pl.col("trunk_run_id").is_not_null())
    num_trunks = branches["trunk_run_id"].n_unique()
    assert len(fig.layout.updatemenus[0].buttons) == num_trunks
    shown = [t for t in fig.data if t.visible]
    lr = [t for t in shown if t.yaxis == "y"]
    trunk, *forks = lr
    assert forks
    for branch in forks:
        # A branch starts on its trunk (the trunk's last logged point before the fork).
        assert branch.x[0] in trunk.x
        assert branch.y[0] == trunk.y[list(trunk.x).index(branch.x[0])]
        assert max(branch.x) < max(trunk.x)
    assert not any(len(t.name) >= 32 and t.name.isalnum() for t in fig.data)


def test_wsd_branches_need_branch_runs(runs, curves):
    with pytest.raises(K3ScaleError, match="no WSD branch runs"):
        trunks.wsd_branches_panel(runs, curves, METRIC)


def test_bands_have_no_markers_and_leave_undefined_stretches_open(runs, fits):
    panel = frontier.frontier_panel(runs, fits, METRIC, "c_6n")
    bands = [t for t in panel.figure.data if t.fill == "toself"]
    assert bands and all(t.mode == "lines" for t in bands)
    for band in bands:
        assert all(v is not None and np.isfinite(v) for v in band.y)
    assert frontier.finite_stretches([1.0, np.nan, 2.0, 3.0], [1.0, 1.0, np.nan, 3.0]) == [
        [0],
        [3],
    ]
    assert frontier.finite_stretches([1.0, 2.0, 3.0]) == [[0, 1, 2]]


def test_frontier_caption_promises_no_band_it_does_not_draw(runs, fit_document):
    doc = copy.deepcopy(fit_document)
    routes = doc["results"]["compute_optimal"]["c_6n"]["routes"]
    # Every route either skipped or refused: nothing is drawn with a band.
    routes["envelope"] = {"skipped": "no Pareto points"}
    routes["monotone"] = {"skipped": "fewer than 2 Pareto points"}
    for arm in routes["surface"]["arms"].values():
        arm["surface"]["verdict"] = "not identified: beta on the grid's edge"
    for arm in routes["envelope_e0"]["arms"].values():
        arm["law"]["verdict"] = "not identified: alpha on its bound"
    panel = frontier.frontier_panel(runs, DashboardFits.from_artifact(doc), METRIC, "c_6n")
    assert not any(t.fill == "toself" for t in panel.figure.data)
    assert "band: 95%" not in panel.caption
    assert "envelope route skipped: no Pareto points" in panel.caption
    assert "monotone route skipped: fewer than 2 Pareto points" in panel.caption
    assert "envelope_e0 route dotted, refused: alpha on its bound" in panel.caption


def test_every_route_has_its_own_line_colour_and_marker():
    """Four routes on one figure: each told apart by dash, colour and marker, none dotted like a
    refused one, and no route in an arm's colour (the multiplier figure colours routes)."""
    for style in (theme.ROUTE_DASH, theme.ROUTE_COLOURS, theme.ROUTE_SYMBOL):
        assert set(style) == set(ROUTES)
        assert len(set(style.values())) == len(ROUTES)
    assert theme.UNIDENTIFIED_DASH not in theme.ROUTE_DASH.values()
    assert set(theme.ROUTE_DASH.values()) <= set(theme.DASH_WORDS)
    arms = set(theme.ARCH_COLOURS.values()) | set(theme.SCHEDULE_COLOURS.values())
    assert not arms & set(theme.ROUTE_COLOURS.values())


def test_counts_get_integer_ticks(runs):
    panel = overview.overview_panel(runs)
    axis = panel.figure.layout.yaxis
    assert axis.tickformat == "d" and axis.dtick >= 1 and float(axis.dtick).is_integer()


def test_bars_stand_on_zero_on_a_linear_axis(runs):
    """A bar's height is its size only on a linear axis from zero (issue 51: on a log axis the
    compute bars drew a 0.78 ratio as 1/15)."""
    figure = overview.overview_panel(runs).figure
    bars = [t for t in figure.data if t.type == "bar"]
    assert bars
    for bar in bars:
        axis = figure.layout["yaxis" + (bar.yaxis or "y")[1:]]
        assert axis.type in (None, "linear", "-"), axis.type
        assert axis.rangemode == "tozero" or (axis.range is not None and axis.range[0] == 0)


def test_log_axes_use_power_exponents(fits):
    panel = frontier.multiplier_panel(fits, "c_6n", "k3")
    assert panel.figure.layout.template.layout.yaxis.exponentformat == "power"
    lo, hi = panel.figure.layout.yaxis.range
    routes = fits.comparisons["c_6n"].routes.values()
    points = [e for r in routes for e in r.multiplier["k3"] if e.value is not None]
    values = [e.value for e in points] + [v for e in points if e.identified for v in e.interval]
    values.append(1.0)
    assert hi - lo <= np.log10(max(values) / min(values)) + 0.2
    assert 10**lo <= min(values) and max(values) <= 10**hi


def test_seed_noise_pairs_each_rerun_with_its_original():
    import polars as pl

    from k3scale.viz.seeds import seed_noise_panel, seed_pairs

    base = {
        "status": "finished",
        "cell": "c",
        "arch": "k3",
        "schedule": "cosine",
        "size": "k3-t1",
        "budget_tokens": 1000,
        "batch_size": 8,
        "batch_tokens": 512,
        "n_active": 10,
        "tokens": 1000,
        "c_6n": 6e4,
        "c_attn": 7e4,
    }
    rows = [
        {**base, "run_id": "a", "arm": "tuned", "lr": 0.01, "seed": 0, "loss": 3.00},
        {**base, "run_id": "b", "arm": "seed", "lr": 0.01, "seed": 1, "loss": 3.04},
        {**base, "run_id": "c", "arm": "tuned", "lr": 0.02, "seed": 0, "loss": 3.10},
        {**base, "run_id": "d", "arm": "seed", "lr": 0.02, "seed": 1, "loss": 3.08},
    ]
    runs = pl.DataFrame(rows)
    pairs = seed_pairs(runs, "loss")
    assert sorted(round(d, 6) for d in pairs["diff"]) == [-0.02, 0.04]
    panel = seed_noise_panel(runs, "loss")
    sigma = (((0.04**2 + 0.02**2) / 2) ** 0.5) / 2**0.5
    assert f"sigma = {sigma:.3g}" in panel.caption
    assert panel.figure.layout.yaxis.range[1] >= 0.04


def test_lr_sweep_pairs_budgets_by_rank_when_each_size_has_its_own(runs):
    # Budgets set per parameter give k2 and k3 other token counts at each rung; the sweep must
    # still put them in one subplot per (rung, budget rank), as the analysis pairs them.
    shifted = runs.with_columns(
        pl.when(pl.col("arch") == "k3")
        .then(pl.col("budget_tokens") + 7)
        .otherwise(pl.col("budget_tokens"))
        .alias("budget_tokens")
    )
    panel = lr_sweep.lr_sweep_panel(shifted, "arch", "k2", "cosine", METRIC)
    assert "over 9 cells" in panel.caption
    titles = [a.text for a in panel.figure.layout.annotations if "tokens" in a.text]
    assert len(titles) == 9 and all("-" in t.split("D=")[1] for t in titles)


def test_on_one_lr_grid_the_shared_setting_is_the_other_arms_grid_trial():
    # The v2 k2_vs_k3 study tuned both archs on one LR lattice and ran no shared arm.
    runs = pl.read_parquet(COMMITTED / "k2_vs_k3-cpu_v2" / "runs.parquet")
    assert runs.filter(pl.col("arm") == "shared").is_empty()
    panel = lr_sweep.lr_sweep_panel(runs, "arch", "k2", "wsd", METRIC)
    shared = [t for t in panel.figure.data if t.name.endswith("(shared setting)")]
    k2_best = best_trials(runs.filter(pl.col("arch") == "k2"), METRIC)
    k3_tried = runs.filter(pl.col("arch") == "k3").select("size", "budget_tokens", "lr")
    # Each arm's grid has its own centre per rung, so K3 was tried at K2's best LR in some cells
    # only: exactly those cells show K3 at K2's best.
    k3_size = {s: s.replace("k2-", "k3-") for s in k2_best["size"].to_list()}
    on_both = sorted(
        best["lr"]
        for best in k2_best.iter_rows(named=True)
        if k3_tried.filter(
            (pl.col("size") == k3_size[best["size"]]) & (pl.col("lr") == best["lr"])
        ).height
    )
    assert on_both, "no cell where K3's grid holds K2's best LR"
    assert sorted({x for t in shared for x in t.x}) == pytest.approx(sorted(set(on_both)))
    assert all(t.name.startswith("k3 at k2's best") for t in shared)
