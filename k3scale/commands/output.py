"""What commands print for people: numbers rounded to what their intervals justify, and a
heartbeat on stderr while a long computation runs without progress of its own."""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time

# Significant digits of a number printed without an interval.
BARE_DIGITS = 4
# Significant digits of an interval's half-width: they fix the last digit shown (the usual
# rule for quoting a measurement with its uncertainty).
INTERVAL_DIGITS = 2


def with_interval(value: float | None, ci: list | tuple | None) -> str:
    """`value [lo, hi]`, all three to the decimal place of the interval's half-width at
    `INTERVAL_DIGITS` significant digits; `value` alone to `BARE_DIGITS` without an interval."""
    if value is None or not math.isfinite(value):
        return "undefined"
    if not ci or any(x is None or not math.isfinite(x) for x in ci) or ci[1] <= ci[0]:
        return f"{value:.{BARE_DIGITS}g}"
    place = math.floor(math.log10((ci[1] - ci[0]) / 2)) - (INTERVAL_DIGITS - 1)
    return f"{at_place(value, place)} [{at_place(ci[0], place)}, {at_place(ci[1], place)}]"


def at_place(x: float, place: int) -> str:
    """`x` rounded to the digit of 10**place: 406.4 at place 1 is "410", 1.8172 at -3 "1.817"."""
    if x != 0 and not 1e-4 <= abs(x) < 1e6:
        digits = max(1, math.floor(math.log10(abs(x))) - place + 1)
        return f"{x:.{digits - 1}e}"
    return f"{round(x, -place):.{max(0, -place)}f}"


@contextlib.contextmanager
def heartbeat(what: str, *, after_s: float = 5.0, every_s: float = 10.0, out=None):
    """While the block runs longer than `after_s`, a line on stderr every `every_s` seconds
    saying what runs and for how long, so a long fit is not mistaken for a hang."""
    out = out or sys.stderr
    done = threading.Event()
    started = time.monotonic()

    def beat() -> None:
        wait = after_s
        while not done.wait(wait):
            print(f"{what}: {time.monotonic() - started:.0f} s so far", file=out, flush=True)
            wait = every_s

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
