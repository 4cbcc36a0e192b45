"""The one timing helper of the bench scripts: median milliseconds of repeated calls after warm-up.

Standard library only: `bench/torch_sdpa.py` imports it under a Python that has torch but not JAX.
`--clock cpu` (the scripts' default) counts only this process's CPU time, which on a core shared
with other jobs is steadier than wall-clock.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


def median_ms(run: Callable[[], object], reps: int, *, clock: str = "cpu", warmup: int = 1) -> float:
    """Median over `reps` timed calls of `run()` (which must block until its work is done), after `warmup` calls."""
    now = CLOCKS[clock]
    for _ in range(warmup):
        run()
    times = []
    for _ in range(reps):
        start = now()
        run()
        times.append((now() - start) * 1e3)
    return statistics.median(times)
