"""The sweep's per-trial overhead bookkeeping (driver.task_timing, run.overhead_summary)."""

from __future__ import annotations

import pytest

from k3scale.sweep.driver import task_timing
from k3scale.sweep.run import overhead_summary


def worker_output(busy_s: float, runs: list[dict[str, float]]) -> dict:
    return {
        "busy_s": busy_s,
        "import_s": 0.5,
        "results": {str(i): {"time_s": run} for i, run in enumerate(runs)},
    }


def test_overhead_is_slot_time_minus_the_runs_step_time():
    # A trunk with one branch: two runs, their phases summed.
    output = worker_output(
        9.0,
        [
            {"setup": 0.4, "steps": 5.0, "eval": 0.6, "total": 6.0},
            {"setup": 0.2, "steps": 2.0, "eval": 0.3, "total": 2.5},
        ],
    )
    timing = task_timing(output, slot_s=10.0)
    assert timing["steps_s"] == pytest.approx(7.0)
    assert timing["overhead_s"] == pytest.approx(3.0)
    assert timing["setup_s"] == pytest.approx(0.6) and timing["eval_s"] == pytest.approx(0.9)
    assert timing["runs"] == 2


def test_summary_takes_medians_and_splits_the_rest():
    timings = [
        task_timing(worker_output(3.0, [{"setup": 0.2, "steps": 2.0, "eval": 0.3}]), slot)
        for slot in (3.0, 3.5, 12.0)  # the last: a fresh worker's start
    ]
    summary = overhead_summary(timings)
    assert summary["fixed_overhead_s_per_trial"] == pytest.approx(1.5)
    assert summary["fixed_overhead_s_max"] == pytest.approx(10.0)
    phases = summary["overhead_by_phase_s"]
    assert phases["imports"] == 0.5 and phases["run_setup"] == 0.2 and phases["evaluation"] == 0.3
    assert phases["tracking"] == phases["checkpoints"] == 0.0
    assert phases["other"] == pytest.approx(1.5 - 0.5 - 0.2 - 0.3)
    assert overhead_summary([]) == {}


def test_mlflow_calls_and_checkpoints_are_their_own_phases():
    run = {"setup": 0.2, "steps": 2.0, "eval": 0.3, "track": 0.4, "checkpoint": 0.1}
    summary = overhead_summary([task_timing(worker_output(4.0, [run, run]), slot_s=6.0)])
    phases = summary["overhead_by_phase_s"]
    assert phases["tracking"] == pytest.approx(0.8) and phases["checkpoints"] == pytest.approx(0.2)
    assert summary["fixed_overhead_s_per_trial"] == pytest.approx(2.0)
    assert phases["other"] == pytest.approx(2.0 - 0.5 - 0.4 - 0.6 - 0.8 - 0.2)
