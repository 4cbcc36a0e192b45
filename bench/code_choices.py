"""Every XLA:CPU choice `backends.model_hooks` makes, against the model without it, in one sitting.

    MULTI30K_DIR=... taskset -c 0 python -m bench.code_choices --rounds 4     # results/code_choices.md

Two workloads, on real Multi30k at the small size (bench/lib.py's `SIZES`), in float32 and bfloat16:
- train: the training loop's step over an epoch's bucket shapes (`bench.lib.Ours`, as bench.peer times it),
  in useful target tokens/s;
- decode: beam-4 search, batches of 20 test sources, 63 steps (`bench.lib.OursDecode`, as
  bench.peer_decode times it), in seconds a batch.

Each variant takes one choice out by replacing the `TransformerConfig` hook that `model_hooks` chose
for the CPU (`bench.lib.with_fields`), or by `beam_search`'s own switch:

    matmul xla          dot_general None: Flax's `lax.dot_general` instead of `row_major_dot_general`
    dropout bernoulli   dropout_keep None: Flax's `jax.random.bernoulli` instead of the 16-bit split
    no few-query        the (K Q^T)^T logits for few queries against many keys taken out
    no narrow row       the float32 product for one 16-bit query per K/V head taken out
    no barriers         `materialize` (cache writes, beam queries, logits) an identity
    no logits barrier   `beam_search(..., logits_barrier=False)` alone

Rounds alternate the order of the variants (reversed in odd rounds). A ratio is the variant's speed
over the chosen model's in the same round (above 1: the variant is faster, the choice does not pay),
median over rounds. Every figure is this process's CPU time (`--clock cpu`), so pin it to a core of
its own. The header names the CPU, the releases and the lock (`bench.lib.cpu_description`).
"""

from __future__ import annotations

import argparse
import statistics

import jax

from attention.formulation import Formulation
from backends import xla_cpu
from bench.lib import Ours, OursDecode, corpus_vocab, cpu_description, our_config
from configs import default
from training.core import precision
from training.data.corpus import load_corpus


class Without(xla_cpu.XlaCpuFormulation):
    """XLA:CPU's formulation with some of its pieces taken out: "few_queries", "narrow_row", "barriers"."""

    def __init__(self, *pieces: str):
        super().__init__()
        self.pieces = frozenset(pieces)

    def scores(self, q, k, *, precision, heads_sharing_kv):
        narrow = xla_cpu._one_narrow_row(q, heads_sharing_kv)
        few = q.shape[0] <= xla_cpu.FEW_QUERIES_PER_KEY * k.shape[0]
        if narrow and "narrow_row" not in self.pieces or few and "few_queries" not in self.pieces:
            if narrow and "narrow_row" in self.pieces:  # the few-query form is what such a row took otherwise
                return super().scores(q[:1], k, precision=precision, heads_sharing_kv=2)
            return super().scores(q, k, precision=precision, heads_sharing_kv=heads_sharing_kv)
        return Formulation.scores(self, q, k, precision=precision, heads_sharing_kv=heads_sharing_kv)

    def mix(self, weights, v, *, precision, heads_sharing_kv):
        if xla_cpu._one_narrow_row(weights, heads_sharing_kv) and "narrow_row" in self.pieces:
            return Formulation.mix(self, weights, v, precision=precision, heads_sharing_kv=heads_sharing_kv)
        return super().mix(weights, v, precision=precision, heads_sharing_kv=heads_sharing_kv)

    def materialize(self, tree):
        return tree if "barriers" in self.pieces else super().materialize(tree)


TRAIN_VARIANTS = {  # label: TransformerConfig fields replaced
    "as chosen": {},
    "matmul xla": {"dot_general": None},
    "dropout bernoulli": {"dropout_keep": None},
}
DECODE_VARIANTS = {  # label: (TransformerConfig fields replaced, beam_search switches)
    "as chosen": ({}, {}),
    "matmul xla": ({"dot_general": None}, {}),
    "no few-query": ({"formulation": Without("few_queries")}, {}),
    "no narrow row": ({"formulation": Without("narrow_row")}, {}),
    "no barriers": ({"formulation": Without("barriers")}, {}),
    "no logits barrier": ({}, {"logits_barrier": False}),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3, help="timed train steps per bucket shape a round")
    parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
    parser.add_argument("--workloads", nargs="*", default=["train", "decode"], choices=["train", "decode"])
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    args = parser.parse_args()

    config = default.get_config()
    train, vocab = corpus_vocab(config)
    print(cpu_description())
    print(f"jax {jax.__version__}, {jax.default_backend()}, clock {args.clock}")
    verdict = precision.measure("auto")  # what model.dtype "auto" decides here, by its start-up check
    print(f"model.dtype 'auto' check: float32 {verdict['float32_s'] * 1e3:.1f} ms, bfloat16 {verdict['bfloat16_s'] * 1e3:.1f} ms "
          f"-> {verdict['dtype']} (bfloat16 must be {precision.MIN_SPEEDUP}x faster)", flush=True)
    sides = {}
    if "train" in args.workloads:
        src, tgt = vocab.encode(list(train.src)), vocab.encode(list(train.tgt))
        for dtype in args.dtypes:
            for label, fields in TRAIN_VARIANTS.items():
                sides["train", dtype, label] = Ours(our_config("small", dtype, {}), vocab, src, tgt, args.reps, fields)
    if "decode" in args.workloads:
        sources = vocab.encode(list(load_corpus(config, "test_2016_flickr").src[:60]))
        for dtype in args.dtypes:
            for label, (fields, options) in DECODE_VARIANTS.items():
                sides["decode", dtype, label] = OursDecode(dtype, vocab, sources, 20, 63, beam=4, model_overrides=fields, **options)

    def measure(key):
        side = sides[key]
        if key[0] == "train":
            return side.epoch_rates(args.clock)["useful_tok_s"]
        return 1.0 / side.seconds_per_batch(args.clock)  # batches a second: higher is faster, as tokens/s

    print("\n| round | workload | dtype | variant | speed | variant / as chosen |")
    print("|---:|---|---|---|---:|---:|")
    ratios = {key: [] for key in sides}
    speeds_of = {key: [] for key in sides}
    order = list(sides)
    for r in range(args.rounds):
        speeds = {key: measure(key) for key in (order if r % 2 == 0 else order[::-1])}
        for key in order:
            base = speeds[(*key[:2], "as chosen")]
            ratios[key].append(speeds[key] / base)
            speeds_of[key].append(speeds[key])
            unit = "useful tok/s" if key[0] == "train" else "batches/s"
            print(f"| {r + 1} | {key[0]} | {key[1]} | {key[2]} | {speeds[key]:,.2f} {unit} | {ratios[key][-1]:.3f} |", flush=True)
    print("\n| workload | dtype | variant | variant / as chosen, median (each round) |")
    print("|---|---|---|---:|")
    for key, each in ratios.items():
        if key[2] != "as chosen":
            print(f"| {key[0]} | {key[1]} | {key[2]} | **{statistics.median(each):.3f}** ({', '.join(f'{x:.3f}' for x in each)}) |")
    if {"float32", "bfloat16"} <= set(args.dtypes) and "train" in args.workloads:  # the check's verdict, end to end
        each = [b / f for f, b in zip(speeds_of[("train", "float32", "as chosen")], speeds_of[("train", "bfloat16", "as chosen")])]
        print(f"\ntrain step as chosen, bfloat16 / float32 useful tok/s: **{statistics.median(each):.3f}** "
              f"({', '.join(f'{x:.3f}' for x in each)}); 'auto' picked {verdict['dtype']}")

if __name__ == "__main__":
    main()
