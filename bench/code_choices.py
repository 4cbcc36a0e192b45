"""Every XLA:CPU choice `backends.model_hooks` makes, against the model without it, in one sitting.

    MULTI30K_DIR=... taskset -c 0 python -m bench.code_choices --rounds 4     # results/code_choices.md

Two workloads, on real Multi30k at the small size (`bench.lib.SIZES`), in float32 and bfloat16:
- train: the training loop's step over an epoch's bucket shapes (`bench.lib.Ours`, as bench.peer times it),
  in useful target tokens/s;
- decode: beam-4 search, batches of 20 test sources, 63 steps (`bench.lib.OursDecode`, as
  bench.peer_decode times it), in seconds a batch.

Each variant takes one choice out by replacing the `TransformerConfig` hook that `model_hooks` chose
for the CPU (`bench.lib.with_fields`):

    matmul flipped      dot_general swapped: `lax.dot_general` where "auto" chose `row_major_dot_general`
                        (16-bit compute), `row_major_dot_general` where it chose XLA's (float32)
    dropout bernoulli   dropout_keep None: Flax's `jax.random.bernoulli` instead of the 16-bit split
    no barriers         `materialize` (cache writes, beam queries, logits) an identity
    no logits barrier   the decode step's log-probabilities plain, the other barriers kept
                        (`bench.lib.no_logits_barrier`)

Rounds alternate the order of the variants (reversed in odd rounds). A ratio is the variant's speed
over the chosen model's in the same round (above 1: the variant is faster, the choice does not pay),
median over rounds; results/code_choices.md also keeps the choices deleted after such a sitting.
Every figure is this process's CPU time (`--clock cpu`), so pin it to a core of its own. The header names
the CPU, the releases and the lock (`bench.lib.cpu_description`).
"""

from __future__ import annotations

import argparse
import statistics

import jax

import backends
from backends import xla_cpu, xla_cpu_bf16
from bench.lib import Ours, OursDecode, corpus_vocab, cpu_description, no_logits_barrier, our_config
from configs import default
from training.core import precision
from training.core.markdown import markdown_row, markdown_table
from training.data.corpus import load_corpus


class NoBarriers(xla_cpu.XlaCpuFormulation):
    """XLA:CPU's formulation with its `materialize` barriers taken out."""

    def materialize(self, tree):
        return tree


TRAIN_VARIANTS = {  # label: TransformerConfig fields replaced
    "as chosen": {},
    "matmul flipped": {"dot_general": "flipped"},
    "dropout bernoulli": {"dropout_keep": None},
}
DECODE_VARIANTS = {  # label: TransformerConfig fields replaced
    "as chosen": {},
    "matmul flipped": {"dot_general": "flipped"},
    "no barriers": {"formulation": NoBarriers()},
    "no logits barrier": {"formulation": no_logits_barrier()},
}


def flipped(fields: dict, dtype: str) -> dict:
    """`fields` with a "flipped" dot_general resolved: the matmul "auto" did not choose for `dtype` on the CPU."""
    if fields.get("dot_general") != "flipped":
        return fields
    chosen = backends.dense_dot_general("auto", jax.numpy.dtype(dtype), "cpu")
    return {**fields, "dot_general": None if chosen else xla_cpu_bf16.row_major_dot_general}


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
    print(
        f"model.dtype 'auto' check: float32 {verdict['float32_s'] * 1e3:.1f} ms, "
        f"bfloat16 {verdict['bfloat16_s'] * 1e3:.1f} ms "
        f"-> {verdict['dtype']} (bfloat16 must be {precision.MIN_SPEEDUP}x faster)",
        flush=True,
    )
    sides = {}
    if "train" in args.workloads:
        src, tgt = vocab.encode(list(train.src)), vocab.encode(list(train.tgt))
        for dtype in args.dtypes:
            for label, fields in TRAIN_VARIANTS.items():
                sides["train", dtype, label] = Ours(
                    our_config("small", dtype, {}), vocab, src, tgt, args.reps, flipped(fields, dtype)
                )
    if "decode" in args.workloads:
        sources = vocab.encode(list(load_corpus(config, "test_2016_flickr").src[:60]))
        for dtype in args.dtypes:
            for label, fields in DECODE_VARIANTS.items():
                sides["decode", dtype, label] = OursDecode(
                    dtype, vocab, sources, 20, 63, beam=4, model_overrides=flipped(fields, dtype)
                )

    def measure(key):
        side = sides[key]
        if key[0] == "train":
            return side.epoch_rates(args.clock)["useful_tok_s"]
        return 1.0 / side.seconds_per_batch(args.clock)  # batches a second: higher is faster, as tokens/s

    print(
        "\n" + markdown_table(["round", "workload", "dtype", "variant", "speed", "variant / as chosen"], [], "rlllrr")
    )
    speeds = {key: [] for key in sides}  # per round, in `order`'s keys
    ratio = lambda key, r: speeds[key][r] / speeds[(*key[:2], "as chosen")][r]
    order = list(sides)
    for r in range(args.rounds):
        for key in order if r % 2 == 0 else order[::-1]:
            speeds[key].append(measure(key))
        for key in order:
            unit = "useful tok/s" if key[0] == "train" else "batches/s"
            print(markdown_row([r + 1, *key, f"{speeds[key][r]:,.2f} {unit}", f"{ratio(key, r):.3f}"]), flush=True)
    print(
        "\n" + markdown_table(["workload", "dtype", "variant", "variant / as chosen, median (each round)"], [], "lllr")
    )
    for key in order:
        if key[2] != "as chosen":
            each = [ratio(key, r) for r in range(args.rounds)]
            rounds = ", ".join(f"{x:.3f}" for x in each)
            print(markdown_row([*key, f"**{statistics.median(each):.3f}** ({rounds})"]))
    if {"float32", "bfloat16"} <= set(args.dtypes) and "train" in args.workloads:  # the check's verdict, end to end
        each = [
            b / f for f, b in zip(speeds["train", "float32", "as chosen"], speeds["train", "bfloat16", "as chosen"])
        ]
        print(
            f"\ntrain step as chosen, bfloat16 / float32 useful tok/s: **{statistics.median(each):.3f}** "
            f"({', '.join(f'{x:.3f}' for x in each)}); 'auto' picked {verdict['dtype']}"
        )


if __name__ == "__main__":
    main()
