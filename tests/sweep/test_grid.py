"""LR-grid tuning (issue 20, point 3): the grid's points, its extensions, the preset's checks,
the extensions chosen from real (in-memory) Optuna studies, and `study plan`'s counts."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys

import optuna
import pytest
from optuna.trial import TrialState

from k3scale.errors import K3ScaleError
from k3scale.sweep import sources
from k3scale.sweep.declaration import LRGrid, SearchSpace, Study, StudyPreset
from k3scale.sweep.grid import count_extensions, grid_lrs, lr_extent, next_extension
from k3scale.sweep.planner import estimate_cost

GRID = LRGrid(center=1e-2, points=5, ratio=1.5, max_extensions=2, batch_size=16)
SEARCH = SearchSpace(lr_low=1e-3, lr_high=1e-1, batch_sizes=(8, 16))


def preset(grid: LRGrid | None = GRID, **overrides) -> StudyPreset:
    fields = dict(sizes={"k3": ("k3-t0",)}, budgets=(16_384, 32_768), search=SEARCH)
    return StudyPreset(**(fields | overrides), trials_per_cell=4, lr_grid=grid)


def test_grid_lrs_are_geometric_around_the_center():
    lrs = grid_lrs(GRID)
    assert len(lrs) == 5 and lrs[2] == pytest.approx(1e-2, rel=1e-12)
    assert [b / a for a, b in itertools.pairwise(lrs)] == pytest.approx([1.5] * 4)
    even = grid_lrs(LRGrid(center=1e-2, points=4, ratio=1.6, batch_size=8))
    assert math.sqrt(even[1] * even[2]) == pytest.approx(1e-2, rel=1e-12)
    low, high = lr_extent(GRID)
    assert (low, high) == pytest.approx((lrs[0] / 1.5**2, lrs[-1] * 1.5**2), rel=1e-12)


def test_next_extension_steps_past_the_end_holding_the_best():
    lrs = grid_lrs(GRID)
    assert next_extension(lrs, lrs[-1], GRID, 0) == pytest.approx(lrs[-1] * 1.5, rel=1e-12)
    assert next_extension(lrs, lrs[0], GRID, 0) == pytest.approx(lrs[0] / 1.5, rel=1e-12)
    assert next_extension(lrs, lrs[2], GRID, 0) is None
    assert next_extension(lrs, lrs[-1], GRID, GRID.max_extensions) is None
    # A second extension steps from the first, wherever the tried LRs came from.
    first = next_extension(lrs, lrs[-1], GRID, 0)
    second = next_extension([*lrs, first], first, GRID, 1)
    assert second == pytest.approx(lrs[-1] * 1.5**2, rel=1e-12)
    assert second <= lr_extent(GRID)[1]
    # One LR tried has no end to extend.
    assert next_extension(lrs[:1], lrs[0], GRID, 0) is None


def test_lrs_that_lost_their_last_bits_are_still_the_same_grid_points():
    lrs = grid_lrs(GRID)
    # As if read back from text or computed as a product: equal only to about 1e-15.
    nudged = [lr * (1 + 3e-15) for lr in lrs]
    assert next_extension(nudged, lrs[-1], GRID, 0) == pytest.approx(lrs[-1] * 1.5, rel=1e-12)
    assert next_extension(lrs, nudged[-1], GRID, 0) == pytest.approx(lrs[-1] * 1.5, rel=1e-12)
    assert next_extension(nudged, lrs[3], GRID, 0) is None
    assert count_extensions([*lrs, *nudged], GRID) == 0
    beyond = [lrs[0] / 1.5, lrs[-1] * 1.5, lrs[-1] * 1.5 * (1 - 1e-15)]
    assert count_extensions([*lrs, *beyond], GRID) == 2


def test_a_preset_with_a_grid_plans_its_points_not_trials_per_cell():
    study = Study(name="g", archs=("k3",), schedules=("cosine", "wsd"), presets={"smoke": preset()})
    cost = estimate_cost(study, study.preset("smoke"))
    assert cost["tuning_trials"] == cost["cells"] * GRID.points
    plain = estimate_cost(study, preset(grid=None))
    assert plain["tuning_trials"] == plain["cells"] * 4


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        (dict(points=2), "points must be >= 3"),
        (dict(ratio=1.7), r"ratio must be in \(1, 1.6\]"),
        (dict(ratio=1.0), r"ratio must be in \(1, 1.6\]"),
        (dict(batch_size=0), "batch_size must be >= 1"),
        (dict(batch_size=8.0), "8.0 is not a finite int"),
        (dict(center=-1e-3), "center must be a positive LR"),
        (dict(center="1e-3"), "'1e-3' is not a finite float"),
        (dict(max_extensions=-1), "max_extensions must be >= 0"),
    ],
)
def test_a_bad_grid_is_one_clear_error(grid, message):
    fields = dict(center=1e-2, points=5, batch_size=16) | grid
    with pytest.raises(K3ScaleError, match=f"lr grid: .*{message}"):
        LRGrid(**fields)


def test_each_size_runs_the_grid_on_its_own_centre():
    grid = LRGrid(
        center=1e-2, points=4, ratio=1.6, batch_size=8, size_centers={"k3-t1": 1e-2 / 1.6}
    )
    p = preset(grid, sizes={"k3": ("k3-t0", "k3-t1")})
    small, large = grid.for_size("k3-t0"), grid.for_size("k3-t1")
    assert grid_lrs(small) == grid_lrs(LRGrid(center=1e-2, points=4, ratio=1.6, batch_size=8))
    # One lattice step down: the large rung's points are the small rung's, shifted by one.
    assert grid_lrs(large)[1:] == pytest.approx(grid_lrs(small)[:-1], rel=1e-12)
    assert p.lr_span() == pytest.approx((lr_extent(large)[0], lr_extent(small)[1]), rel=1e-12)
    lr = sources.tuning_distributions(p)["lr"]
    assert (lr.low, lr.high) == pytest.approx(p.lr_span(), rel=1e-12)
    with pytest.raises(K3ScaleError, match="size_centers must be positive"):
        LRGrid(center=1e-2, points=4, batch_size=8, size_centers={"k3-t1": 0.0})


def test_a_grid_that_can_reach_below_10x_lr_min_is_refused():
    # Lowest reachable: 1e-3 / 1.6^(1 + 3) = 1.5e-4, below 10 x 2e-5.
    grid = LRGrid(center=1e-3, points=3, batch_size=8)
    with pytest.raises(K3ScaleError, match="after 3 extensions down, below 10x lr_min"):
        preset(grid, lr_min=2e-5)
    assert preset(grid, lr_min=1e-5).lr_grid == grid


def _told(study: optuna.Study, p: StudyPreset, losses: dict[float, float | None]) -> None:
    """Run the queued trials as the driver does: ask, then tell each its loss (None: failed)."""
    for _ in range(sources.count(study, TrialState.WAITING)):
        trial = study.ask(sources.tuning_distributions(p))
        loss = losses[min(losses, key=lambda lr: abs(math.log(lr / trial.params["lr"])))]
        study.tell(trial, loss, state=TrialState.FAIL if loss is None else None)


def _branch(study: optuna.Study, p: StudyPreset, losses: dict[float, float]) -> None:
    """A branch cell's study as `_tell` fills it: one finished trial per trunk LR."""
    for lr, loss in losses.items():
        study.add_trial(
            optuna.trial.create_trial(
                params={"lr": lr, "batch_size": GRID.batch_size},
                distributions=sources.tuning_distributions(p),
                value=loss,
            )
        )


def test_a_cell_is_extended_until_its_best_is_interior():
    p = preset()
    study = optuna.create_study()
    sources.enqueue_grid(study, GRID)
    sources.enqueue_grid(study, GRID)  # a resumed driver queues nothing twice
    lrs = grid_lrs(GRID)
    assert sources.count(study, TrialState.WAITING) == GRID.points
    # Loss falls with LR across the grid, and rises again one step past its top.
    losses = {lr: 5.0 - k for k, lr in enumerate(lrs)} | {lrs[-1] * 1.5: 4.5}
    _told(study, p, losses)
    (ext,) = sources.grid_extensions(study, [study], GRID)
    assert ext == pytest.approx(lrs[-1] * 1.5, rel=1e-12)
    sources.enqueue_lr(study, ext, GRID)
    _told(study, p, losses)
    assert sources.grid_extensions(study, [study], GRID) == []
    assert sources.best_params(study) == {"lr": lrs[-1], "batch_size": 16}


def test_extensions_stop_at_the_limit_and_after_a_failed_one():
    p = preset()
    lrs = grid_lrs(GRID)
    falling = {lr: -math.log(lr) for lr in (lrs[-1] * 1.5, lrs[-1] * 1.5**2, *lrs)}
    study = optuna.create_study()
    sources.enqueue_grid(study, GRID)
    for _ in range(GRID.max_extensions + 1):
        _told(study, p, falling)
        for lr in sources.grid_extensions(study, [study], GRID):
            sources.enqueue_lr(study, lr, GRID)
    assert len(study.trials) == GRID.points + GRID.max_extensions
    assert sources.grid_extensions(study, [study], GRID) == []
    failed = optuna.create_study()
    sources.enqueue_grid(failed, GRID)
    _told(failed, p, falling | {lrs[-1] * 1.5: None})
    sources.enqueue_lr(failed, sources.grid_extensions(failed, [failed], GRID)[0], GRID)
    _told(failed, p, falling | {lrs[-1] * 1.5: None})
    assert sources.grid_extensions(failed, [failed], GRID) == []


def test_a_shared_trunk_extends_when_any_budget_has_its_best_at_an_end():
    p = preset()
    lrs = grid_lrs(GRID)
    trunk, branch = optuna.create_study(), optuna.create_study()
    sources.enqueue_grid(trunk, GRID)
    _told(trunk, p, {lr: 3.0 + abs(k - 2) for k, lr in enumerate(lrs)})  # interior
    assert sources.grid_extensions(trunk, [trunk], GRID) == []
    _branch(branch, p, {lr: 3.0 + k for k, lr in enumerate(lrs)})  # best at the lowest LR
    (ext,) = sources.grid_extensions(trunk, [trunk, branch], GRID)
    assert ext == pytest.approx(lrs[0] / 1.5, rel=1e-12)
    # The extension's LR lies inside the distributions a branch's result is recorded with.
    _branch(branch, p, {ext: 2.9})
    assert sources.best_params(branch)["lr"] == ext


def test_study_plan_prints_the_grid_and_counts_its_points(tmp_path):
    study = tmp_path / "grid.py"
    study.write_text(
        "from k3scale.sweep.declaration import LRGrid, SearchSpace, Study, StudyPreset\n"
        "SMOKE = StudyPreset(sizes={'k3': ('k3-t0',)}, budgets=(16_384, 32_768),\n"
        "    search=SearchSpace(lr_low=1e-3, lr_high=1e-1, batch_sizes=(8, 16)),\n"
        f"    trials_per_cell=4, lr_grid={GRID!r}, seeds=(0, 1, 2))\n"
        "STUDY = Study(name='g', archs=('k3',), schedules=('cosine', 'wsd'), shared_arm=True,\n"
        "    presets={'smoke': SMOKE})\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "k3scale.cli", "study", "plan", str(study), "--preset", "smoke"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # 4 cells x 5 grid points; 2 seed re-runs per cell; no shared-arm runs: on one grid, WSD's
    # own trial at cosine's best LR is the shared setting.
    assert "4 cells, 20 tuning trials + 8 extra runs" in done.stdout
    lrs = ", ".join(f"{lr:.3g}" for lr in grid_lrs(GRID))
    assert f"lr grid: peak lr {lrs} (5 points, x1.5 apart), batch size 16" in done.stdout
    assert "up to 2 more lr per cell" in done.stdout
