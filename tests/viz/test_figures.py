"""Figure builders added for issue 21: IsoFLOP minima, LR sweeps of both arms, WSD trunks with
branches, and the conventions every difference and ratio figure states. Fast (no browser)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from k3scale.errors import K3ScaleError
from k3scale.scaling.isoflop import isoflop_minimum
from k3scale.viz import frontier, hp, isoflop, lr_sweep, overview, schedules, trunks
from k3scale.viz.summaries import cell_optima
from tests.viz.make_fixture import true_loss

METRIC = "final_val_ood_loss"
COMMITTED = Path(__file__).resolve().parents[2] / "analysis" / "results"


def _isoflop_runs() -> pl.DataFrame:
    """One tuned run per cell on an IsoFLOP design: 5 sizes at each of 2 budgets C = 6 N D."""
    rows = []
    for c in (1e12, 4e12):
        for n in (30_000, 60_000, 120_000, 240_000, 480_000):
            d = int(c / (6 * n))
            loss = true_loss("k2", "t1", d, "cosine", 2.5e-2, 12) + (
                0.3 / (n / 30_000) ** 0.3 - 0.3
            )
            rows.append(
                {
                    "run_id": f"r{len(rows)}",
                    "status": "finished",
                    "arm": "tuned",
                    "cell": f"k2-{n}|D{d}|cosine",
                    "arch": "k2",
                    "schedule": "cosine",
                    "size": f"k2-{n}",
                    "budget_tokens": d,
                    "lr": 1e-2,
                    "batch_size": 8,
                    "batch_tokens": 1024,
                    "n_active": n,
                    "tokens": d,
                    "c_6n": 6.0 * n * d,
                    "c_attn": 7.0 * n * d,
                    METRIC: loss,
                }
            )
    return pl.DataFrame(rows)


def test_isoflop_marks_each_levels_fitted_minimum():
    runs = _isoflop_runs()
    panel = isoflop.isoflop_panel(runs, "k2", "cosine", METRIC)
    stars = [t for t in panel.figure.data if t.marker.symbol in ("star", "star-open")]
    assert len(stars) == 2
    optima = cell_optima(runs, METRIC)
    for star, (level, part) in zip(stars, isoflop.compute_levels(optima, "c_6n")):
        expected = isoflop_minimum(part["n_active"].to_numpy(), part["loss"].to_numpy())
        assert star.x[0] == pytest.approx(expected["n_opt"])
        assert star.y[0] == pytest.approx(expected["loss_opt"])
        assert part["c_6n"].to_numpy() == pytest.approx(level, rel=0.05)
    assert "2 compute levels" in panel.caption
    lo, hi = panel.figure.layout.xaxis.range
    assert 10**lo >= 30_000 / 1.2 and 10**hi <= 480_000 * 1.2


def test_isoflop_on_a_grid_without_shared_compute_is_a_skip_note(runs):
    with pytest.raises(K3ScaleError, match="no IsoFLOP view of k3 cosine"):
        isoflop.isoflop_panel(runs, "k3", "cosine", METRIC)


def test_lr_sweep_overlays_both_schedules_and_marks_the_shared_setting(runs):
    panel = lr_sweep.lr_sweep_panel(runs, "schedule", "cosine", "k3", METRIC)
    part = runs.filter(pl.col("arch") == "k3")
    optima = cell_optima(part, METRIC)
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
    assert "median lr*_wsd/lr*_cosine" in panel.caption
    assert "Ratio convention" in panel.note


def test_lr_sweep_of_archs_shares_design_cells(runs):
    panel = lr_sweep.lr_sweep_panel(runs, "arch", "k2", "cosine", METRIC)
    names = {t.name.split()[0] for t in panel.figure.data if "best" in t.name}
    assert names == {"k2", "k3"}
    assert "over 6 cells" in panel.caption


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


def test_bands_have_no_markers_and_stay_inside_the_data(runs, fits):
    panel = frontier.frontier_panel(runs, fits, METRIC, "c_6n")
    bands = [t for t in panel.figure.data if t.fill == "toself"]
    assert bands and all(t.mode == "lines" for t in bands)
    for fit in (f for f in fits.frontiers if f.compute == "c_6n"):
        lo, hi = fit.data_range
        for trace in panel.figure.data:
            if trace.legendgroup == f"{fit.arch} {fit.schedule}" and trace.mode == "lines":
                assert lo * 0.999 <= min(trace.x) and max(trace.x) <= hi * 1.001
    assert "95% bootstrap band" in panel.caption
    hp_panel = hp.hp_optima_panel(runs, fits, METRIC)
    assert all(t.mode == "lines" for t in hp_panel.figure.data if t.fill == "toself")


def test_frontier_caption_promises_no_band_it_does_not_draw(runs, fits):
    from dataclasses import replace

    bare = replace(fits, frontiers=tuple(replace(f, band=None) for f in fits.frontiers))
    panel = frontier.frontier_panel(runs, bare, METRIC, "c_6n")
    assert not any(t.fill == "toself" for t in panel.figure.data)
    assert "(0 of 4 with a 95% bootstrap band)" in panel.caption


def test_schedule_difference_uses_the_fit_sign_and_draws_only_real_bars(runs):
    panel = schedules.schedule_comparison_panel(runs, "k3", METRIC)
    diff = next(t for t in panel.figure.data if t.name == "cosine − wsd (own optima)")
    assert "cosine − WSD" in panel.note or "cosine − wsd" in panel.note
    own = cell_optima(runs.filter(pl.col("arch") == "k3"), METRIC)
    first = diff.x[0]
    cos = next(t for t in panel.figure.data if t.name == "cosine at own optimum")
    wsd = next(t for t in panel.figure.data if t.name == "wsd at own optimum")
    i = list(cos.x).index(first)
    assert diff.y[0] == pytest.approx(cos.y[i] - wsd.y[list(wsd.x).index(first)])
    # A point from one run (the shared arm) carries no bar, not a zero-length one.
    shared = next(t for t in panel.figure.data if t.name == "wsd at cosine's optimum")
    assert all(v is None for v in shared.error_y.array)
    assert own.height


def test_counts_get_integer_ticks(runs):
    panel = overview.overview_panel(runs)
    axis = panel.figure.layout.yaxis
    assert axis.tickformat == "d" and axis.dtick >= 1 and float(axis.dtick).is_integer()


def test_log_axes_use_power_exponents(runs, fits):
    fit = next(m for m in fits.multipliers if m.compute == "c_6n")
    panel = frontier.multiplier_panel(fit)
    assert panel.figure.layout.template.layout.yaxis.exponentformat == "power"
    lo, hi = panel.figure.layout.yaxis.range
    values = [*fit.band.lo, *fit.band.hi, 1.0]
    assert hi - lo <= np.log10(max(values) / min(values)) + 0.2


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
    assert "over 6 cells" in panel.caption
    titles = [a.text for a in panel.figure.layout.annotations if "tokens" in a.text]
    assert len(titles) == 6 and all("-" in t.split("D=")[1] for t in titles)


def test_on_one_lr_grid_the_shared_setting_is_the_other_arms_grid_trial():
    # The v2 k2_vs_k3 study tuned both archs on one LR lattice and ran no shared arm.
    runs = pl.read_parquet(COMMITTED / "k2_vs_k3-cpu_v2" / "runs.parquet")
    assert runs.filter(pl.col("arm") == "shared").is_empty()
    panel = lr_sweep.lr_sweep_panel(runs, "arch", "k2", "wsd", METRIC)
    shared = [t for t in panel.figure.data if t.name.endswith("(shared setting)")]
    k2_best = cell_optima(runs.filter(pl.col("arch") == "k2"), METRIC)
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
