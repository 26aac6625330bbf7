"""The one timing rule of the benchmark scripts: one warm-up call, then the median of
``repeat`` timed calls (seconds, ``time.perf_counter``)."""
from __future__ import annotations

import statistics
import time
from typing import Callable


def median_seconds(fn: Callable[[], object], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
