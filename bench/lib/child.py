"""A bench script run as a child process from the repository root (`ROOT`), under another interpreter where
asked (the peer's), its last JSON line read back; `clock="cpu"` times it on its own CPU time.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # child processes run `-m bench.…` from here


# Run a module with its step clock on this process's CPU time (argv: module, its arguments).
CPU_CLOCK_SHIM = (
    "import runpy, sys, time; time.perf_counter = time.process_time; "
    "sys.argv = sys.argv[1:]; runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)"
)


def run_json_script(python: str, module: str, args: list[str], clock: str) -> dict:
    """Run `python -m module args` from the repository root and return the last JSON line it prints.

    `clock="cpu"`: through `CPU_CLOCK_SHIM`, so the script's `time.perf_counter` counts its own CPU time.
    """
    cmd = [python, "-c", CPU_CLOCK_SHIM, module, *args] if clock == "cpu" else [python, "-m", module, *args]
    done = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise RuntimeError(f"{module} failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(lines[-1])
