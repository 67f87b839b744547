"""A trial's heartbeat: what it is doing and when it last said so, in its run folder.

The trainer beats at each phase (loading the kernels and building the model, opening its MLflow
run, each step at most every few seconds, evaluating) and the study driver reads the beats of its
running trials: a trial silent for longer than `stall_after_s` is named on the progress line with
what it was last doing (issue 35: a trial waiting forever on a lock printed nothing for ten
minutes). The file sits in the run folder every node of a cluster reaches, and is replaced whole
(write, then rename), so a reader never sees half a beat.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HEARTBEAT_FILE = "heartbeat.json"
# A step beats at most this often: the file write stays off the step time.
MIN_BEAT_INTERVAL_S = 5.0
# A trial is stalled after 3x its last step time without a beat, and never sooner than this:
# start-up (a Ray worker's imports, opening the run) takes tens of seconds on a busy machine.
STALL_FLOOR_S = 120.0
STALL_STEP_FACTOR = 3.0


@dataclass(frozen=True)
class Beat:
    """One heartbeat: wall time, what the trial was doing, its last step's seconds (if any)."""

    time: float
    doing: str
    step_s: float | None = None
    host: str = ""
    pid: int = 0


class Heartbeat:
    """Writes a run folder's beats: a phase at once, steps (`step_s` given) at most every
    `MIN_BEAT_INTERVAL_S` seconds."""

    def __init__(self, folder: Path, enabled: bool = True, clock=time.time) -> None:
        self.path = Path(folder) / HEARTBEAT_FILE
        self.enabled = enabled  # one writer per run: rank 0
        self.clock = clock
        self.last_step_beat = -float("inf")

    def beat(self, doing: str, step_s: float | None = None) -> None:
        if not self.enabled:
            return
        now = self.clock()
        if step_s is not None:
            if now - self.last_step_beat < MIN_BEAT_INTERVAL_S:
                return
            self.last_step_beat = now
        else:
            self.last_step_beat = -float("inf")  # the next step after a phase beats at once
        beat = Beat(now, doing, step_s, socket.gethostname(), os.getpid())
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(f".{HEARTBEAT_FILE}.{os.getpid()}")
        partial.write_text(json.dumps(asdict(beat)))
        os.replace(partial, self.path)


def read_beat(folder: Path) -> Beat | None:
    """The folder's last beat, or None when it has none (or an unreadable one)."""
    try:
        return Beat(**json.loads((Path(folder) / HEARTBEAT_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def stall_after_s(beat: Beat | None) -> float:
    """Seconds of silence after which a trial counts as stalled."""
    step_s = beat.step_s if beat and beat.step_s else 0.0
    return max(STALL_FLOOR_S, STALL_STEP_FACTOR * step_s)
