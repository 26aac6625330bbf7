"""The timing rules of the benchmark scripts (seconds, ``time.perf_counter``).

- :func:`median_seconds`: one warm-up call, then the median of ``repeat`` timed calls.
- :func:`paired_seconds`: two or more calls measured *in turns* (one warm-up each, then
  ``repeat`` rounds in which each runs once, the order reversed every other round). A slow spell
  of the machine then falls on both sides of a ratio instead of on whichever ran during it;
  :func:`median_ratio` turns the rounds into the printed ratio.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence


def median_seconds(fn: Callable[[], object], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def paired_seconds(fns: Sequence[Callable[[], object]], repeat: int,
                   settle: float = 0.05) -> list[list[float]]:
    """Seconds of each of ``fns`` per round: ``rounds[r][i]`` is fns[i]'s time in round r.

    Before each timed call the script sleeps ``settle`` seconds (not timed), so that the worker
    threads the previous call left spinning (ggml's, or another library's OpenMP pool in the
    same process) have gone idle and do not compete with the next one."""
    for fn in fns:
        fn()
    rounds = []
    for r in range(repeat):
        order = range(len(fns)) if r % 2 == 0 else range(len(fns) - 1, -1, -1)
        times = [0.0] * len(fns)
        for i in order:
            time.sleep(settle)
            t0 = time.perf_counter()
            fns[i]()
            times[i] = time.perf_counter() - t0
        rounds.append(times)
    return rounds


def median_ratio(rounds: list[list[float]], num: int, den: int) -> float:
    """Median over rounds of ``rounds[r][num] / rounds[r][den]`` (a ratio of seconds: with ``num``
    the reference, > 1 means ``den`` was faster)."""
    return statistics.median(t[num] / t[den] for t in rounds)
