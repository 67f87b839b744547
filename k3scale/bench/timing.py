"""Side-by-side timing for benchmarks: interleaved repetitions, median of process CPU time."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def time_once(fn: Callable[[], object]) -> float:
    """Process CPU seconds of one call (one thread): time the scheduler gives to other processes
    on shared cores is not counted, which made wall-clock ratios swing by 2x."""
    start = time.process_time()
    fn()
    return time.process_time() - start


def median_times(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """One warm-up each, then `reps` interleaved rounds; median seconds per function."""
    for fn in fns.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            samples[name].append(time_once(fn))
    return {name: statistics.median(values) for name, values in samples.items()}
