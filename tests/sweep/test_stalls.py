"""Stalls announced (issue 35): trials beat in their run folders, and the study's progress line
names a running trial silent for longer than its limit, with what it was last doing."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from k3scale.data.sample import prepare_sample
from k3scale.sweep.driver import _Job, job_stall
from k3scale.sweep.progress import Progress, Stall
from k3scale.track.heartbeat import (
    HEARTBEAT_FILE,
    MIN_BEAT_INTERVAL_S,
    STALL_FLOOR_S,
    Heartbeat,
    read_beat,
    stall_after_s,
)

ROOT = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_phases_beat_at_once_and_steps_at_most_every_few_seconds(tmp_path):
    clock = Clock(1000.0)
    heart = Heartbeat(tmp_path, clock=clock)
    heart.beat("opening its MLflow run")
    assert read_beat(tmp_path).doing == "opening its MLflow run"
    heart.beat("training, step 1 of 9", step_s=0.5)
    clock.now += 1
    heart.beat("training, step 2 of 9", step_s=0.5)
    assert read_beat(tmp_path).doing == "training, step 1 of 9"
    clock.now += MIN_BEAT_INTERVAL_S
    heart.beat("training, step 3 of 9", step_s=0.5)
    beat = read_beat(tmp_path)
    assert (beat.doing, beat.time, beat.step_s) == ("training, step 3 of 9", clock.now, 0.5)
    heart.beat("evaluating at step 3")
    assert read_beat(tmp_path).doing == "evaluating at step 3"


def test_a_missing_or_torn_beat_reads_as_none(tmp_path):
    assert read_beat(tmp_path) is None
    (tmp_path / HEARTBEAT_FILE).write_text('{"time": 1')
    assert read_beat(tmp_path) is None
    Heartbeat(tmp_path, enabled=False).beat("anything")
    assert read_beat(tmp_path) is None


def _job(folder: Path, started: float) -> _Job:
    return _Job(ref=None, params={}, tells=[], label="k3-t0|cell#3", started=started,
                folders=(folder,))  # fmt: skip


def _beat_at(folder: Path, when: float, doing: str, step_s: float | None = None) -> None:
    Heartbeat(folder, clock=lambda: when).beat(doing, step_s=step_s)


def test_a_silent_trial_is_named_with_what_it_last_did(tmp_path):
    now = 10_000.0
    job = _job(tmp_path, started=now - 600)
    _beat_at(tmp_path, now - 300, "loading the kernels and building the model")
    stall = job_stall(job, now)
    assert stall == Stall("k3-t0|cell#3", 300.0, "loading the kernels and building the model")
    _beat_at(tmp_path, now - 10, "training, step 5 of 40", step_s=2.0)
    assert job_stall(job, now) is None


def test_a_slow_step_moves_the_limit_and_a_new_attempt_restarts_the_clock(tmp_path):
    now = 10_000.0
    _beat_at(tmp_path, now - STALL_FLOOR_S - 60, "training, step 5 of 40", step_s=100.0)
    assert stall_after_s(read_beat(tmp_path)) == 300.0
    assert job_stall(_job(tmp_path, started=now - 1000), now) is None
    # The folder's beat is a previous attempt's: the relaunch counts from its own start.
    assert job_stall(_job(tmp_path, started=now - 60), now) is None
    late = job_stall(_job(tmp_path, started=now - STALL_FLOOR_S - 30), now)
    assert late is None
    _beat_at(tmp_path, now - 2000, "training, step 5 of 40", step_s=1.0)
    relaunched = job_stall(_job(tmp_path, started=now - STALL_FLOOR_S - 30), now)
    assert relaunched.doing == "starting (no heartbeat yet)"


def test_the_progress_line_names_the_stalled_trials():
    progress = Progress([], trials_per_cell=1, log=lambda _: None)
    stalls = [Stall("k2-t0|a#1", 250.0, "opening its MLflow run")]
    line = progress.line({}, 1, (0, 4), progress.started + 300, stalled=stalls)
    assert line.endswith("| STALLED: k2-t0|a#1 silent 4.2 min (last: opening its MLflow run)")
    assert "STALLED" not in progress.line({}, 1, (0, 4), progress.started + 300)


def test_a_training_run_leaves_its_last_beat(tmp_path):
    root = tmp_path / "data"
    prepare_sample(root, vocab_size=512)
    out = tmp_path / "run"
    started = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "k3scale.cli", "train", "--preset", "k3-t0", "--steps", "3",
         "--out", str(out), "--set", f"data.root={root}", "--set", "data.dataset=sample"],
        capture_output=True, text=True, cwd=ROOT, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    beat = json.loads((out / HEARTBEAT_FILE).read_text())
    assert beat["doing"] == "final evaluation and logging"
    assert started <= beat["time"] <= time.time()
