"""The live progress line: tuning counts and ETA, extra runs once queued, best losses."""

from __future__ import annotations

from k3scale.sweep.planner import Cell
from k3scale.sweep.progress import Progress

CELLS = [
    Cell(arch="k3", size="k3-t1", budget_tokens=1000, schedule=schedule)
    for schedule in ("cosine", "wsd")
]


def test_line_reports_tuning_eta_then_extra_runs():
    progress = Progress(CELLS, trials_per_cell=4)
    start = progress.started
    best = {CELLS[0].key: 7.25, CELLS[1].key: None}
    line = progress.line(best, running=2, trials=(2, 8), now=start + 120)
    assert "tuning trials 2/8, running 2" in line
    assert "tuning ETA 6.0 min" in line  # 2 trials in 2 min, 6 to go
    assert "extra runs" not in line
    assert f"{CELLS[0].key}=7.250" in line and "cells with a result 1/2" in line
    line = progress.line(best, running=1, trials=(8, 8), now=start + 480, extras=(1, 3))
    assert "tuning trials 8/8, extra runs 1/3, running 1" in line


def test_line_before_any_trial_ends():
    progress = Progress(CELLS, trials_per_cell=4)
    line = progress.line({c.key: None for c in CELLS}, 2, (0, 8), progress.started)
    assert "tuning ETA ?" in line and line.endswith("best: -")


def test_due_only_after_the_interval():
    lines = []
    progress = Progress(CELLS, trials_per_cell=4, log=lines.append, interval=3600.0)
    assert progress.due()  # nothing printed yet
    progress.print({c.key: None for c in CELLS}, 0, (0, 8))
    assert len(lines) == 1 and not progress.due()
