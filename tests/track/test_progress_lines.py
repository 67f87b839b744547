"""Progress lines of a training run: one per interval and one at the last step, with the rate
and ETA of the steps this process took (a resumed run's earlier steps count for neither)."""

from __future__ import annotations

import io

from k3scale.track.progress import FILE_INTERVAL_S, ProgressLines, clock_text


class Clock:
    """A settable clock: the time is data here, not a mock of our code."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_lines_come_at_the_interval_and_at_the_last_step():
    out, clock = io.StringIO(), Clock()
    progress = ProgressLines(10, 0, 1024, interval_s=5.0, out=out, clock=clock)
    for _ in range(10):
        clock.now += 2.0
        progress.set_postfix(loss="3.210")
        progress.update(1)
    lines = out.getvalue().splitlines()
    # Steps 3 (6 s), 6 (12 s) and 9 (18 s) cross the interval; step 10 is the last.
    assert [line.split()[1] for line in lines] == ["3/10", "6/10", "9/10", "10/10"]
    assert lines[0] == "step 3/10 (30%)  loss 3.210  512 tokens/s  elapsed 6s  ETA 14s"
    assert lines[-1].endswith("elapsed 20s  ETA 0s")


def test_a_resumed_run_rates_only_its_own_steps():
    out, clock = io.StringIO(), Clock()
    progress = ProgressLines(100, 90, 2048, interval_s=1.0, out=out, clock=clock)
    clock.now += 4.0
    progress.update(2)
    assert out.getvalue().startswith(
        "step 92/100 (92%)  loss   1,024 tokens/s  elapsed 4s  ETA 16s"
    )


def test_a_file_gets_lines_less_often_than_a_terminal():
    assert ProgressLines(5, 0, 1, out=io.StringIO()).interval_s == FILE_INTERVAL_S


def test_clock_text():
    assert [clock_text(s) for s in (4.4, 185, 7620)] == ["4s", "3m05s", "2h07m"]
