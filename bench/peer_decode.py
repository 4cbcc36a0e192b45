"""Beam-4 decoding against Flax examples/wmt's own beam search, side by side on one core, in sentences/s.

    taskset -c 1 python -m bench.peer_decode --peer_python PEER_PY --wmt_dir WMT    (results/peer.md; as bench/peer.py)

Same work on both sides: the small model (3+3 layers, width 256, 4 heads, MLP 1024, 8k vocabulary,
random weights), batches of `--batch` sources, beam 4, alpha 0.6, `--steps` decode steps. The peer
is `flax_wmt_decode.py` in its own interpreter (the example's `predict_step` and
`decode.beam_search`, pmapped as its loop does, EOS disabled so every step runs; its
max_predict_length is steps + 1). Ours is the `translate` path's jitted `beam_search` on
test_2016_flickr's German sources in order, each batch padded to the bucket of its longest
(as `training.evaluation.translate` pads it), `max_len` = steps. A random model has no reason to
end its beams (EOS is 1 of 8000 tokens, and stopping early needs 4 ended beams in every row),
so ours runs every step too; the rows whose best beam holds an EOS are counted to show it.
The peer pads every source to 64, as the example pads its predict set to max_predict_length;
`--pad_to 64` pads ours so too (equal work in the encoder and the cross-attention).
Rounds alternate which side goes first; `--clock cpu` (the default) as bench/peer.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from bench.peer import CPU_CLOCK_SHIM, cpu_description
from bench.timing import median_ms

from bench.train_step import SIZES
from configs import default
from training import config as config_lib
from training.data import tokenizer
from training.data.batching import BatchSchedule, bucket_length
from training.data.corpus import load_corpus
from training.evaluation.translate import decoder

TOY = dict(d_model=32, num_heads=2, num_layers=1, mlp_dim=64)  # --toy, as flax_wmt_decode.py's (a dry run)


class Ours:
    """Our beam search, compiled for every batch shape of the sources it is given."""

    def __init__(self, dtype: str, vocab, src_ids, batch: int, steps: int, beam: int, pad_to: int = 0, toy: bool = False):
        config = default.get_config()
        config.model.update(TOY if toy else SIZES["small"][0])
        self.model = config_lib.build_model(config, vocab, dtype)
        tokens = jnp.ones((1, 2), jnp.int32)
        self.params = jax.jit(self.model.init)(jax.random.key(0), tokens, tokens)["params"]
        self.decode = decoder(self.model, beam, 0.6, steps)
        self.batches = []
        for start in range(0, len(src_ids) - batch + 1, batch):
            chunk = [ids[:pad_to] if pad_to else ids for ids in src_ids[start : start + batch]]  # the peer cuts to its length too
            length = pad_to or bucket_length(max(map(len, chunk)), config.data.bucket_lengths)
            self.batches.append(jnp.asarray(BatchSchedule.assemble(chunk, [[] for _ in chunk], batch, length).src))
        out = [np.asarray(self.decode(self.params, src)) for src in self.batches]  # compile every shape
        self.rows_with_eos = sum(int((o == self.model.config.eos_id).any(axis=1).sum()) for o in out)
        self.rows = batch * len(self.batches)

    def seconds_per_batch(self, clock: str) -> float:
        """Median over the batches of one batch's seconds (each batch once)."""
        batches = iter(self.batches)
        return median_ms(lambda: jax.block_until_ready(self.decode(self.params, next(batches))),
                         len(self.batches), clock=clock, warmup=0) / 1e3


def run_peer(args) -> dict:
    script = str(Path(args.peer_dir) / "flax_wmt_decode.py")
    cmd = [script, "--wmt_dir", args.wmt_dir, "--batch", str(args.batch), "--max_len", str(args.steps + 1),
           "--batches", str(args.batches), "--beam", str(args.beam)]
    cmd += ["--dtype", args.peer_dtype] if args.peer_dtype else []
    cmd += ["--toy"] if args.toy else []
    cmd = [args.peer_python, "-c", CPU_CLOCK_SHIM, *cmd] if args.clock == "cpu" else [args.peer_python, *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise RuntimeError(f"peer failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(lines[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peer_python", default=sys.executable, help="an interpreter with the peer's packages (default: this one)")
    parser.add_argument("--wmt_dir", default=os.environ.get("FLAX_WMT_DIR", ""), required="FLAX_WMT_DIR" not in os.environ,
                        help="a snapshot of Flax's examples/wmt (default: $FLAX_WMT_DIR)")
    parser.add_argument("--peer_dir", default=str(Path(__file__).parent), help="the folder holding flax_wmt_decode.py (default: bench/)")
    parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"], help="ours (the peer runs float32, as on CPU)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--steps", type=int, default=63, help="decode steps (the peer's max_len - 1)")
    parser.add_argument("--batches", type=int, default=3, help="timed batches a round, each side")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--pad_to", type=int, default=0, help="pad our sources to this length (0: to their bucket, as translate does)")
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    parser.add_argument("--peer_dtype", default="", help="the peer's compute dtype (default: the example's preferred_dtype)")
    parser.add_argument("--toy", action="store_true", help="toy models both sides and a small vocabulary (a dry run)")
    args = parser.parse_args()

    config = default.get_config()
    train = load_corpus(config, config.data.train_split)
    pairs, vocab_size = (2000, 500) if args.toy else (len(train.src), config.data.vocab_size)
    vocab = tokenizer.load(tokenizer.train(train.src[:pairs] + train.tgt[:pairs], vocab_size, config.seed))
    test = load_corpus(config, "test_2016_flickr")
    src_ids = vocab.encode(list(test.src[: args.batch * args.batches]))
    ours = {d: Ours(d, vocab, src_ids, args.batch, args.steps, args.beam, args.pad_to, args.toy) for d in args.dtypes}
    print(f"{cpu_description()}; affinity {sorted(os.sched_getaffinity(0))}")
    print(f"jax {jax.__version__}, {jax.default_backend()}, clock {args.clock}; batch {args.batch}, beam {args.beam}, "
          f"{args.steps} steps; ours: test_2016_flickr sources 1-{len(src_ids)} (mean {np.mean([len(s) for s in src_ids]):.1f} "
          f"tokens, padded to {args.pad_to or 'their bucket'}), rows whose best beam holds EOS: " + ", ".join(f"{d} {o.rows_with_eos}/{o.rows}" for d, o in ours.items()))
    print("\n| round | side | dtype | s a batch | sentences/s | vs peer |")
    print("|---:|---|---|---:|---:|---:|")
    ratios = {d: [] for d in args.dtypes}
    for r in range(args.rounds):
        results = {}
        print(f"<!-- round {r + 1}: load average {os.getloadavg()[0]:.2f} -->", flush=True)
        for side in (["ours", "peer"] if r % 2 == 0 else ["peer", "ours"]):
            if side == "peer":
                results["peer"] = run_peer(args)
            else:
                results |= {d: o.seconds_per_batch(args.clock) for d, o in ours.items()}
        peer = results["peer"]
        print(f"| {r + 1} | flax wmt (mean source {peer['mean_src_len']}) | {peer['dtype']} | {peer['median_s']:.3f} | "
              f"{peer['sent_per_s']:.2f} | 1 |", flush=True)
        for d in args.dtypes:
            ratios[d].append(peer["median_s"] / results[d])
            print(f"| {r + 1} | ours | {d} | {results[d]:.3f} | {args.batch / results[d]:.2f} | {ratios[d][-1]:.2f} |", flush=True)
    print("\n| ours dtype | rounds | sentences/s vs peer, median (each) |")
    print("|---|---:|---:|")
    for d, xs in ratios.items():
        print(f"| {d} | {len(xs)} | **{statistics.median(xs):.2f}** ({', '.join(f'{x:.2f}' for x in xs)}) |")


if __name__ == "__main__":
    main()
