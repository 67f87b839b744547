"""Progress lines of a training run for the person watching it: steps, loss, tokens/s, ETA.

Plain lines rather than a redrawn bar, so a log file or a pipe gets them too (issue 21): one
every few seconds on a terminal, less often otherwise, and one at the last step.
"""

from __future__ import annotations

import sys
import time

# Seconds between lines: a terminal is being watched; a log file only needs a heartbeat.
TTY_INTERVAL_S = 5.0
FILE_INTERVAL_S = 30.0


class ProgressLines:
    """The subset of tqdm's interface the training loop uses (`update`, `set_postfix`, `close`).

    Args:
        total: steps of the whole run.
        done: steps already taken (a resumed run); they count for neither rate nor ETA.
        batch_tokens: tokens per step, for tokens/s.
        interval_s: least seconds between two lines (None: by whether `out` is a terminal).
        out: where lines go (default stderr, so stdout keeps only results).
        clock: seconds, monotonic.
    """

    def __init__(
        self,
        total: int,
        done: int,
        batch_tokens: int,
        *,
        interval_s: float | None = None,
        out=None,
        clock=time.monotonic,
    ) -> None:
        self.out = out or sys.stderr
        if interval_s is None:
            interval_s = TTY_INTERVAL_S if self.out.isatty() else FILE_INTERVAL_S
        self.total, self.step, self.first = total, done, done
        self.batch_tokens = batch_tokens
        self.interval_s = interval_s
        self.clock = clock
        self.started = self.last_line = clock()
        self.loss = ""

    def set_postfix(self, loss: str = "", **_) -> None:
        self.loss = loss

    def update(self, steps: int = 1) -> None:
        self.step += steps
        now = self.clock()
        if self.step >= self.total or now - self.last_line >= self.interval_s:
            self.last_line = now
            print(self.line(now), file=self.out, flush=True)

    def line(self, now: float) -> str:
        elapsed = now - self.started
        taken = self.step - self.first
        per_step = elapsed / taken if taken else 0.0
        tokens_per_s = self.batch_tokens / per_step if per_step else 0.0
        eta = per_step * (self.total - self.step)
        return (
            f"step {self.step}/{self.total} ({self.step / self.total:.0%})  loss {self.loss}  "
            f"{tokens_per_s:,.0f} tokens/s  elapsed {clock_text(elapsed)}  ETA {clock_text(eta)}"
        )

    def close(self) -> None:
        """Nothing to tear down: every line is already written."""


def clock_text(seconds: float) -> str:
    """4s, 3m05s, 2h07m."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
