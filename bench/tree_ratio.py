"""Two checkouts of this repository side by side on the CPU: a change's train step and decode against the code before.

    MULTI30K_DIR=... taskset -c 0 python -m bench.tree_ratio BEFORE_TREE AFTER_TREE --rounds 5

A refactor that should move no figure is checked here: each tree gets one worker process started
inside it (its own `attention`, `models`, `training` and `bench` are imported: Python puts the working
directory first on `sys.path`), which builds what bench/code_choices.py measures as chosen -- the small
model's train step over Multi30k's bucketed batches (useful target tokens/s) and beam search (beam 4,
batches of 20 test sources, 63 steps; batches/s) -- for each dtype, compiled before the first round.
Then the rounds alternate the trees' order and each prints AFTER / BEFORE; the summary is the median
ratio per workload and dtype with every round's. Both workers run on this process's cores (pin it with
`taskset`); times are CPU time (`--clock wall` for wall-clock).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from bench.lib import cpu_description
from training.core.markdown import markdown_row, markdown_table

# the worker: the code of whichever tree it runs in, driven line by line over stdin ("train DTYPE" / "decode DTYPE")
WORKER = """
import json, sys
from bench.lib import Ours, OursDecode, corpus_vocab, our_config
from configs import default
from training.data.corpus import load_corpus
reps, clock, dtypes = int(sys.argv[1]), sys.argv[2], sys.argv[3].split(",")
config = default.get_config()
train, vocab = corpus_vocab(config)
src, tgt = vocab.encode(list(train.src)), vocab.encode(list(train.tgt))
sources = vocab.encode(list(load_corpus(config, "test_2016_flickr").src[:60]))
sides = {}
for dtype in dtypes:
    sides["train", dtype] = Ours(our_config("small", dtype, {}), vocab, src, tgt, reps)
    sides["decode", dtype] = OursDecode(dtype, vocab, sources, 20, 63, beam=4)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    workload, dtype = line.split()
    side = sides[workload, dtype]
    rate = side.epoch_rates(clock)["useful_tok_s"] if workload == "train" else 1.0 / side.seconds_per_batch(clock)
    print(json.dumps({"rate": rate}), flush=True)
"""


class Worker:
    """One tree's worker process; `rate(workload, dtype)` measures once."""

    def __init__(self, tree: str, reps: int, clock: str, dtypes: list[str]):
        self.process = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(reps), clock, ",".join(dtypes)],
            cwd=tree,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._read()  # compiled and ready

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"a worker exited early (exit {self.process.wait()}); see its stderr above")
        return json.loads(line)

    def rate(self, workload: str, dtype: str) -> float:
        self.process.stdin.write(f"{workload} {dtype}\n")
        self.process.stdin.flush()
        return self._read()["rate"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", help="the checkout before the change")
    parser.add_argument("after", help="the checkout with the change")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=3, help="timed train steps per bucket shape a round")
    parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
    parser.add_argument("--workloads", nargs="*", default=["train", "decode"], choices=["train", "decode"])
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    args = parser.parse_args()
    import jax

    print(cpu_description())
    print(f"jax {jax.__version__}, clock {args.clock}; before {args.before}, after {args.after}", flush=True)
    workers = {
        side: Worker(tree, args.reps, args.clock, args.dtypes)
        for side, tree in (("before", args.before), ("after", args.after))
    }
    keys = [(w, d) for w in args.workloads for d in args.dtypes]
    ratios: dict = {key: [] for key in keys}
    print("\n" + markdown_table(["round", "workload", "dtype", "before", "after", "after / before"], [], "rllrrr"))
    for r in range(args.rounds):
        for key in keys:
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            rates = {side: workers[side].rate(*key) for side in order}
            ratios[key].append(rates["after"] / rates["before"])
            cells = [f"{rates['before']:,.2f}", f"{rates['after']:,.2f}", f"{ratios[key][-1]:.3f}"]
            print(markdown_row([r + 1, *key, *cells]), flush=True)
    medians = [
        [*key, f"**{statistics.median(each):.3f}** ({', '.join(f'{x:.3f}' for x in each)})"]
        for key, each in ratios.items()
    ]
    print("\n" + markdown_table(["workload", "dtype", "after / before, median (each round)"], medians, "llr"))
    for worker in workers.values():
        worker.close()


if __name__ == "__main__":
    main()
