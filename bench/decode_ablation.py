"""What one piece of a beam-4 decode step costs: the step as it is against the step without that piece.

    MULTI30K_DIR=... taskset -c 1 python -m bench.decode_ablation --ablate reorder --rounds 6
    MULTI30K_DIR=... taskset -c 1 python -m bench.decode_ablation --ablate logits_barrier --rounds 6
                                                                    (results/peer.md, section 5)

Times the `bench.peer_decode` workload (`bench.lib.OursDecode`: small model, random weights,
batches of 20, beam 4, 63 steps) twice in one process, alternating which goes first: as it is, and
with one piece taken out, each side its own jitted decoder. `models.beam_search` has no switches;
this bench builds each ablated side itself:
- `reorder`: the per-step cache reorder, taken out by `models.decoding._beam_search(reorder_cache=False)`:
  the private entry point `beam_search` calls with the reorder on, the one private name this bench
  reaches (as an attribute), so the switch stays out of the public API. It decodes wrong beams at the cost of
  everything else, so the ratio bounds what a reorder-free cache could gain. Since the beam rows
  (`attention.beams`) it reorders no keys or values, only layers' own states (none in this model):
  before them, the float32 ratio was 0.804 (results/peer.md, section 5).
- `logits_barrier`: the barrier between the vocabulary matmul and log_softmax, taken out by the
  model's formulation: `bench.lib.no_logits_barrier()`, XLA:CPU's with the plain `decode_log_probs`, so XLA
  may fuse them again; the ratio is what the barrier gains. Only XLA:CPU's formulation has the barrier,
  so this ablation runs where the model is given it (the CPU).
"""

from __future__ import annotations

import argparse
import functools
import statistics

import jax

from backends import xla_cpu
from bench.lib import OursDecode, corpus_vocab, cpu_description, no_logits_barrier
from configs import default
from models import decoding
from training.core.markdown import markdown_row, markdown_table
from training.data.corpus import load_corpus

ABLATIONS = ("reorder", "logits_barrier")


def build_pair(args, vocab, src_ids) -> tuple[OursDecode, OursDecode]:
    """(the decoder as it is, the ablated one), each compiled for every batch shape."""
    build = lambda **options: OursDecode(args.dtype, vocab, src_ids, args.batch, args.steps, beam=4, **options)
    intact = build()
    if args.ablate == "reorder":
        return intact, build(search=functools.partial(decoding._beam_search, reorder_cache=False))
    if args.ablate != "logits_barrier":
        raise ValueError(f"--ablate = {args.ablate!r}; expected one of {ABLATIONS}")
    chosen = intact.model.config.formulation
    if chosen != xla_cpu.FORMULATION:
        raise ValueError(
            f"the model's formulation = {chosen!r}; --ablate logits_barrier expected XLA:CPU's "
            f"({xla_cpu.FORMULATION!r}), the only one with a logits barrier: run it on the CPU"
        )
    return intact, build(model_overrides={"formulation": no_logits_barrier()})


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ablate", choices=ABLATIONS, required=True)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--batches", type=int, default=3, help="timed batches a round, each side")
    parser.add_argument("--steps", type=int, default=63)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    args = parser.parse_args()

    config = default.get_config()
    _, vocab = corpus_vocab(config)
    src_ids = vocab.encode(list(load_corpus(config, "test_2016_flickr").src[: args.batch * args.batches]))
    intact, ablated = build_pair(args, vocab, src_ids)

    print(cpu_description())
    print(
        f"jax {jax.__version__}, {jax.default_backend()}, {args.dtype}, clock {args.clock}; batch {args.batch}, "
        f"beam 4, {args.steps} steps, {len(intact.batches)} batches a side a round; ablated: {args.ablate}\n"
    )
    print(markdown_table(["round", "s a batch, as it is", "s a batch, ablated", "ablated / as it is"], [], "rrrr"))
    ratios = []
    for r in range(args.rounds):
        sides = (intact, ablated) if r % 2 == 0 else (ablated, intact)
        seconds = {id(side): side.seconds_per_batch(args.clock) for side in sides}
        ratios.append(seconds[id(ablated)] / seconds[id(intact)])
        cells = [f"{seconds[id(intact)]:.3f}", f"{seconds[id(ablated)]:.3f}", f"{ratios[-1]:.3f}"]
        print(markdown_row([r + 1, *cells]), flush=True)
    print(f"\nmedian ablated / as it is: **{statistics.median(ratios):.3f}** ({', '.join(f'{x:.3f}' for x in ratios)})")


if __name__ == "__main__":
    main()
