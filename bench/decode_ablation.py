"""How much of a beam-4 decode step the per-step cache reorder costs: the most a reorder-free cache could gain.

    MULTI30K_DIR=... taskset -c 1 python -m bench.beam_reorder --rounds 5     (results/peer.md, section 5)

Beam search reorders every layer's self-attention cache after each step, so that beam k continues
the beam it was chosen from (`models.decoding._gather_cache`). A reorder-free design (attention
reading each beam's history through an index table) would drop that gather and copy but attend
over all K beams' rows. This times the `bench.peer_decode` workload (small model, random weights,
batches of 20, beam 4, 63 steps, float32) twice in one process, alternating: as it is, and with
the reorder replaced by the identity, which decodes wrong beams at the cost of everything else.
Their ratio bounds what the reorder-free cache can gain. The replacement is checked to have been
traced into the compiled step (the best beam often comes out the same: with random weights it
tends to descend from beam 0, whose cache row the identity leaves right).
"""

from __future__ import annotations

import argparse
import os
import statistics
from unittest import mock

import jax

from bench.peer import cpu_description
from bench.peer_decode import Ours
from configs import default
from training.data import tokenizer
from training.data.corpus import load_corpus


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--batches", type=int, default=3, help="timed batches a round, each side")
    parser.add_argument("--steps", type=int, default=63)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    args = parser.parse_args()

    config = default.get_config()
    train = load_corpus(config, config.data.train_split)
    vocab = tokenizer.load(tokenizer.train(train.src + train.tgt, config.data.vocab_size, config.seed))
    src_ids = vocab.encode(list(load_corpus(config, "test_2016_flickr").src[: args.batch * args.batches]))
    build = lambda: Ours(args.dtype, vocab, src_ids, args.batch, args.steps, beam=4)
    reordered = build()
    jax.clear_caches()  # else JAX reuses the trace of the equal `decoder` closure, reorder included
    traced = []
    with mock.patch("models.decoding._gather_cache", lambda cache, beams: traced.append(beams) or cache):
        unordered = build()  # compiles every batch shape inside the patch
    if not traced:
        raise RuntimeError("the identity reorder was never traced: the patch did not reach the compiled step")

    print(f"{cpu_description()}; affinity {sorted(os.sched_getaffinity(0))}")
    print(f"jax {jax.__version__}, {jax.default_backend()}, {args.dtype}, clock {args.clock}; batch {args.batch}, "
          f"beam 4, {args.steps} steps, {len(reordered.batches)} batches a side a round\n")
    print("| round | s a batch, reordered | s a batch, no reorder | reordered / no reorder |")
    print("|---:|---:|---:|---:|")
    ratios = []
    for r in range(args.rounds):
        sides = (reordered, unordered) if r % 2 == 0 else (unordered, reordered)
        seconds = {id(side): side.seconds_per_batch(args.clock) for side in sides}
        with_reorder, without = seconds[id(reordered)], seconds[id(unordered)]
        ratios.append(with_reorder / without)
        print(f"| {r + 1} | {with_reorder:.3f} | {without:.3f} | {ratios[-1]:.3f} |", flush=True)
    print(f"\nmedian reordered / no reorder: **{statistics.median(ratios):.3f}** "
          f"({', '.join(f'{x:.3f}' for x in ratios)})")


if __name__ == "__main__":
    main()
