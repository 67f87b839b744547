"""Rendering a 2,000-run study: a benchmark-style print, with only a generous functional bound.

The target is under 10 s on a free core; the assertion (60 s) only catches pathological slowdowns
(e.g. an accidental per-run figure), since timings on a shared CI machine are not tests.
"""

from __future__ import annotations

import time
from pathlib import Path

from k3scale.commands.dashboard import render
from tests.viz.make_fixture import make_tables

DATA = Path(__file__).parent / "data"
# 36 cells x (53 tuned + 2 seed) + 18 shared-arm runs = 1,998 runs.
TRIALS_PER_CELL = 53
GENEROUS_BOUND_S = 60.0


def test_render_2000_run_study(tmp_path, fit_files):
    runs, curves = make_tables(trials_per_cell=TRIALS_PER_CELL, seed=1)
    runs.write_parquet(tmp_path / "runs.parquet")
    curves.write_parquet(tmp_path / "curves.parquet")
    wall, cpu = time.perf_counter(), time.process_time()
    text, panels, skipped = render(
        tmp_path, fit_files["k2_vs_k3"], "k2_vs_k3", "final_val_ood_loss", "inline"
    )
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(
        f"\nrender {runs.height} runs / {curves.height} curve rows: {len(panels)} figures, "
        f"{len(text) / 1e6:.1f} MB, {wall:.2f} s wall, {cpu:.2f} s CPU"
    )
    # The fixture has no WSD branches.
    assert all(n.startswith("no WSD branch") for n in skipped)
    assert len(panels) == 20  # the seed-noise figure and M(C) under both FLOP counts included
    assert wall < GENEROUS_BOUND_S
