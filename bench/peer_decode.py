"""Beam-4 decoding against Flax examples/wmt's own beam search, side by side on one core, in sentences/s.

    taskset -c 1 python -m bench.peer_decode --peer_python PEER_PY --wmt_dir WMT
    (results/peer.md; WMT as bench/peer.py's)

Same work on both sides: the small model (3+3 layers, width 256, 4 heads, MLP 1024, 8k vocabulary,
random weights), batches of `--batch` sources, beam 4, alpha 0.6, `--steps` decode steps. The peer
is `bench/flax_wmt_decode.py` in its own interpreter (the example's `predict_step` and
`decode.beam_search`, pmapped as its loop does, EOS disabled so every step runs; its
max_predict_length is steps + 1). Ours is `models.beam_search`, jitted as the `translate` path
jits it (`bench.lib.OursDecode`), on test_2016_flickr's German sources in order, each batch padded to
the bucket of its longest (as `training.evaluation.translate` pads it), `max_len` = steps. A random
model has no reason to
end its beams (EOS is 1 of 8000 tokens, and stopping early needs 4 ended beams in every row),
so ours runs every step too; the rows whose best beam holds an EOS are counted to show it.
The peer pads every source to 64, as the example pads its predict set to max_predict_length;
`--pad_to 64` pads ours so too (equal work in the encoder and the cross-attention).
Rounds alternate which side goes first; `--clock cpu` (the default) as bench/peer.py.
"""

from __future__ import annotations

import argparse
import os
import statistics

import jax
import numpy as np

from bench.lib import OursDecode, add_peer_arguments, corpus_vocab, cpu_description, flax_wmt_dir, run_json_script
from configs import default
from training.core.markdown import markdown_row, markdown_table
from training.data.corpus import load_corpus


def run_peer_decode(args) -> dict:
    """The peer's beam search (`bench.flax_wmt_decode` under `args.peer_python`): its JSON line."""
    cmd = [
        "--wmt_dir",
        args.wmt_dir,
        "--batch",
        str(args.batch),
        "--max_len",
        str(args.steps + 1),
        "--batches",
        str(args.batches),
        "--beam",
        str(args.beam),
    ]
    cmd += ["--dtype", args.peer_dtype] if args.peer_dtype else []
    cmd += ["--toy"] if args.toy else []
    return run_json_script(args.peer_python, "bench.flax_wmt_decode", cmd, args.clock)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_peer_arguments(parser)
    parser.add_argument(
        "--dtypes", nargs="*", default=["float32", "bfloat16"], help="ours (the peer runs float32, as on CPU)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--steps", type=int, default=63, help="decode steps (the peer's max_len - 1)")
    parser.add_argument("--batches", type=int, default=3, help="timed batches a round, each side")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument(
        "--pad_to", type=int, default=0, help="pad our sources to this length (0: to their bucket, as translate does)"
    )
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    parser.add_argument(
        "--peer_dtype", default="", help="the peer's compute dtype (default: the example's preferred_dtype)"
    )
    parser.add_argument("--toy", action="store_true", help="toy models both sides and a small vocabulary (a dry run)")
    args = parser.parse_args()
    args.wmt_dir = flax_wmt_dir(args.wmt_dir)
    if not args.wmt_dir:
        parser.error("no snapshot of Flax's examples/wmt: pass --wmt_dir or set FLAX_WMT_DIR or FLAX_GIT_DIR")

    config = default.get_config()
    _, vocab = corpus_vocab(config, *((2000, 500) if args.toy else ()))
    test = load_corpus(config, "test_2016_flickr")
    src_ids = vocab.encode(list(test.src[: args.batch * args.batches]))
    ours = {
        d: OursDecode(d, vocab, src_ids, args.batch, args.steps, args.beam, args.pad_to, args.toy) for d in args.dtypes
    }
    print(cpu_description())
    print(
        f"jax {jax.__version__}, {jax.default_backend()}, clock {args.clock}; batch {args.batch}, beam {args.beam}, "
        f"{args.steps} steps; ours: test_2016_flickr sources 1-{len(src_ids)} "
        f"(mean {np.mean([len(s) for s in src_ids]):.1f} "
        f"tokens, padded to {args.pad_to or 'their bucket'}), rows whose best beam holds EOS: "
        + ", ".join(f"{d} {o.rows_with_eos}/{o.rows}" for d, o in ours.items())
    )
    print("\n" + markdown_table(["round", "side", "dtype", "s a batch", "sentences/s", "vs peer"], [], "rllrrr"))
    ratios = {d: [] for d in args.dtypes}
    for r in range(args.rounds):
        results = {}
        print(f"<!-- round {r + 1}: load average {os.getloadavg()[0]:.2f} -->", flush=True)
        for side in ["ours", "peer"] if r % 2 == 0 else ["peer", "ours"]:
            if side == "peer":
                results["peer"] = run_peer_decode(args)
            else:
                results |= {d: o.seconds_per_batch(args.clock) for d, o in ours.items()}
        peer = results["peer"]
        side = f"flax wmt (mean source {peer['mean_src_len']})"
        print(
            markdown_row([r + 1, side, peer["dtype"], f"{peer['median_s']:.3f}", f"{peer['sent_per_s']:.2f}", 1]),
            flush=True,
        )
        for d in args.dtypes:
            ratios[d].append(peer["median_s"] / results[d])
            cells = [f"{results[d]:.3f}", f"{args.batch / results[d]:.2f}", f"{ratios[d][-1]:.2f}"]
            print(markdown_row([r + 1, "ours", d, *cells]), flush=True)
    medians = [
        [d, len(xs), f"**{statistics.median(xs):.2f}** ({', '.join(f'{x:.2f}' for x in xs)})"]
        for d, xs in ratios.items()
    ]
    print("\n" + markdown_table(["ours dtype", "rounds", "sentences/s vs peer, median (each)"], medians, "lrr"))


if __name__ == "__main__":
    main()
