"""A live progress line per study: cells done, trials running, best loss per cell, elapsed, ETA."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from k3scale.sweep.planner import Cell

# Cells whose best loss fits on the progress line; `k3scale study status` lists all of them.
SHOWN_CELLS = 6


@dataclass(frozen=True)
class Stall:
    """A running trial that has not beaten for longer than its limit, and what it last did."""

    label: str
    silent_s: float
    doing: str

    def describe(self) -> str:
        return f"{self.label} silent {self.silent_s / 60:.1f} min (last: {self.doing})"


class Progress:
    """One line when the driver asks and `interval` seconds have passed (`due`), and a last one."""

    def __init__(
        self, cells: list[Cell], trials_per_cell: int, log=print, interval: float = 15.0
    ) -> None:
        self.cells = cells
        self.trials_per_cell = trials_per_cell
        self.log = log
        self.interval = interval
        self.started = time.time()
        self.last = 0.0

    def due(self) -> bool:
        """Whether `interval` seconds have passed since the last line (callers gather the line's
        numbers from the study databases only then)."""
        return time.time() - self.last >= self.interval

    def print(
        self,
        best: dict[str, float | None],
        running: int,
        trials: tuple[int, int],
        extras: tuple[int, int] = (0, 0),
        stalled: list[Stall] | None = None,
    ) -> None:
        self.last = time.time()
        self.log(self.line(best, running, trials, self.last, extras, stalled))
        sys.stdout.flush()

    def line(
        self,
        best: dict[str, float | None],
        running: int,
        trials: tuple[int, int],
        now: float,
        extras: tuple[int, int] = (0, 0),
        stalled: list[Stall] | None = None,
    ) -> str:
        ended, planned = trials
        cells_done = sum(value is not None for value in best.values())
        elapsed = now - self.started
        known = [(key, value) for key, value in sorted(best.items()) if value is not None]
        shown = ", ".join(f"{key}={value:.3f}" for key, value in known[:SHOWN_CELLS])
        if len(known) > SHOWN_CELLS:
            shown += f", ... (+{len(known) - SHOWN_CELLS} cells)"
        # Tuning trials only; seed re-runs and the shared arm are queued as cells finish tuning,
        # so their total grows and they are counted apart, outside the ETA.
        eta = f"{elapsed / ended * (planned - ended) / 60:.1f} min" if ended else "?"
        extra_ended, extra_queued = extras
        extra = f", extra runs {extra_ended}/{extra_queued}" if extra_queued else ""
        stalls = f" | STALLED: {'; '.join(s.describe() for s in stalled)}" if stalled else ""
        return (
            f"[{elapsed / 60:5.1f} min] tuning trials {ended}/{planned}{extra}, running {running}, "
            f"cells with a result {cells_done}/{len(self.cells)}, tuning ETA {eta} "
            f"| best: {shown or '-'}{stalls}"
        )
