"""Import cost: median wall seconds of `python -c "import X"` in fresh processes, alternating, per interpreter.

    taskset -c 0 python -m bench.import_time /tmp/libvenv/bin/python .venv/bin/python   # results/packaging.md

Each round runs every (interpreter, statement) once, the order reversed in odd rounds; run from /tmp so
that the clone is not on the path (the library venv must import its installed `attention`).
"""

import argparse
import statistics
import subprocess
import tempfile
import time

from training.core.markdown import markdown_table

STATEMENTS = ("pass", "import flax", "import flax.linen, flax.nnx", "import attention")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pythons", nargs="+", help="interpreters to time")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    elsewhere = tempfile.gettempdir()
    times = {(p, m): [] for p in args.pythons for m in STATEMENTS}
    order = list(times)
    for r in range(args.rounds):
        for p, m in order if r % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            subprocess.run([p, "-c", m], check=True, cwd=elsewhere)
            times[p, m].append(time.perf_counter() - start)
    rows = [
        [p, f"`{m}`", f"{statistics.median(ts):.2f}", f"{min(ts):.2f}-{max(ts):.2f}"] for (p, m), ts in times.items()
    ]
    print(markdown_table(["interpreter", "statement", "median s", "range s"], rows, "llrr"))


if __name__ == "__main__":
    main()
