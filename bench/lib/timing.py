"""Timing a call, and the machine it ran on (its CPU, bfloat16 flags, cores and the releases).

`--clock cpu` (the scripts' default) counts only this process's CPU time, which on a core shared with other
jobs is steadier than wall-clock.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

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


def median_seconds(fn, args, reps, clock="wall"):
    """Seconds of `fn(*args)` on `clock` (the first two calls compile and warm up)."""
    import jax

    return median_ms(lambda: jax.block_until_ready(fn(*args)), reps, clock=clock, warmup=2) / 1e3


def cpu_description() -> str:
    """`lscpu`'s model name, the CPU's bfloat16 / AMX flags (from /proc/cpuinfo), this process's cores and
    `releases()`."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    field = lambda name: next(
        (line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith(name)), "?"
    )
    flags = [f for f in field("flags").split() if "bf16" in f or f.startswith("amx") or f in ("avx2", "avx512f")]
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    return f"{field('model name')} ({' '.join(flags) or 'no avx2/avx512/bf16 flags'}); affinity {affinity}{releases()}"


def releases() -> str:
    """'; jax 0.12.1, ..., requirements.lock 1a2b3c4d5e6f' (training/core/provenance.py), '' where the project
    cannot be imported (this module under another interpreter, e.g. torch's for bench/torch_sdpa.py)."""
    try:
        from training.core import provenance
    except ImportError:
        return ""
    return f"; {provenance.describe()}"
