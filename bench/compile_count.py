"""Programs one Table 3 preset run compiles, read from the run's own "programs compiled" log line.

    MULTI30K_DIR=... taskset -c 0 python -m bench.compile_count             # the preset as committed (buckets)
    MULTI30K_DIR=... taskset -c 0 python -m bench.compile_count --packed    # the packed variant (configs/table3_preset.py)

A preset run with the preset's structure (bucket lengths, token budget, ten dev evaluations with
greedy BLEU, bfloat16, row-major matmuls) at a tiny model size, enough steps that every bucket
shape is drawn, and a cold, private compilation cache: what it compiles is what a real point
compiles, at a fraction of the time. Prints the log line and the run's wall time.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time

from bench.lib import LogLines, tiny_preset
from training.run import loop


def count(packed: bool, steps: int, train_limit: int) -> tuple[str, float]:
    """(the run's "compilation in this invocation" line, wall seconds) of one cold run."""
    config = tiny_preset(packed, steps, train_limit)
    lines = LogLines()
    root = logging.getLogger()
    root.addHandler(lines)
    root.setLevel(logging.INFO)
    try:
        with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as workdir:
            config.compilation_cache_dir = cache
            start = time.perf_counter()
            loop.train_and_evaluate(config, workdir)
            wall = time.perf_counter() - start
    finally:
        root.removeHandler(lines)
    line = next(x for x in lines.lines if x.startswith("compilation in this invocation"))
    return line, wall


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--packed", action="store_true", help="the preset's packed variant (new sweeps)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--train_limit", type=int, default=3000)
    args = parser.parse_args(argv)
    line, wall = count(args.packed, args.steps, args.train_limit)
    print(f"{'packed' if args.packed else 'buckets'}: {line}; run wall {wall:.1f}s")


if __name__ == "__main__":
    main()
