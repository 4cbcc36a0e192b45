"""Programs one Table 3 preset run compiles, read from the run's own "programs compiled" log line.

    MULTI30K_DIR=... taskset -c 0 python -m bench.compile_count             # the preset as committed (buckets)
    MULTI30K_DIR=... taskset -c 0 python -m bench.compile_count --packed    # the packed variant (table3_preset.py)

A preset run with the preset's structure (bucket lengths or packed rows, token budget, ten dev
evaluations with greedy BLEU, bfloat16, row-major matmuls) and the preset's own vocabulary (8,000
pieces over every training pair: token lengths decide which evaluation lengths are drawn) at a tiny
model size, enough steps that every training shape is drawn, and a cold, private compilation cache:
what it compiles is what a real point compiles (the count depends on shapes, not on widths or step
counts), at a fraction of the time. Prints the log line, the run's wall time and the programs by name.
`--vocab_size 500 --train_limit 3000` is the smaller, faster setting of earlier measurements (its
longer token sequences also draw the max_len evaluation shapes: two programs more).
"""

from __future__ import annotations

import argparse
import collections
import logging
import re
import tempfile
import time

import jax

from bench.lib import LogLines, tiny_preset
from training.run import loop

# what `jax.log_compiles` logs for each program compiled (or loaded from the persistent cache)
COMPILING = re.compile(r"^Compiling (\S+) with global shapes")


def count(
    packed: bool, steps: int, train_limit: int = 0, vocab_size: int | None = None
) -> tuple[str, float, list[str]]:
    """(the run's "compilation in this invocation" line, wall seconds, the programs by name) of one cold run."""
    config = tiny_preset(packed, steps, train_limit, vocab_size)
    lines = LogLines()
    root = logging.getLogger()
    root.addHandler(lines)
    root.setLevel(logging.INFO)
    try:
        with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as workdir, jax.log_compiles():
            config.compilation_cache_dir = cache
            start = time.perf_counter()
            loop.train_and_evaluate(config, workdir)
            wall = time.perf_counter() - start
    finally:
        root.removeHandler(lines)
    line = next(x for x in lines.lines if x.startswith("compilation in this invocation"))
    programs = [m.group(1) for x in lines.lines if (m := COMPILING.match(x))]
    return line, wall, programs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--packed", action="store_true", help="the preset's packed variant (new sweeps)")
    parser.add_argument(
        "--steps",
        type=int,
        default=0,
        help="training steps (0: 40 packed, one shape; 200 with buckets, to draw them all)",
    )
    parser.add_argument("--train_limit", type=int, default=0, help="the first N training pairs (0: all, as the preset)")
    parser.add_argument("--vocab_size", type=int, default=0, help="SentencePiece pieces (0: the preset's own)")
    args = parser.parse_args(argv)
    steps = args.steps or (40 if args.packed else 200)
    line, wall, programs = count(args.packed, steps, args.train_limit, args.vocab_size or None)
    print(f"{'packed' if args.packed else 'buckets'}: {line}; run wall {wall:.1f}s")
    print(
        "programs: " + ", ".join(f"{name} x{n}" if n > 1 else name for name, n in collections.Counter(programs).items())
    )


if __name__ == "__main__":
    main()
