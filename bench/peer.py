"""Our training step against Flax examples/wmt's, side by side on one core, in useful target tokens/s.

    taskset -c 1 python -m bench.peer --peer_python PEER_PY --wmt_dir WMT      (results/peer.md)

WMT: a snapshot of Flax's examples/wmt (default: $FLAX_WMT_DIR, else extracted from the google/flax
git dir $FLAX_GIT_DIR, `bench.lib.flax_wmt_dir`); PEER_PY: an interpreter with its packages (default:
this one; `bench.lib.import_flax_example` stubs its TensorFlow/clu imports where they are missing).

Each round times, per size, the peer and ours, alternating which goes first (ours first in even
rounds). The peer is `bench/flax_wmt_step.py` in its own interpreter: the example's own `train_step`,
pmapped and donated as its loop does, on packed rows of 64 at its fill. Ours is the training
loop's own trainer (`training.parallel.trainers`, donated) on the default config at that size,
fed real Multi30k batches from `BatchSchedule`, their padding included. Same slots per step
(`data.token_budget` = the peer's rows x 64), dropout 0.1; attention dropout as each side's config
has it (the peer's 0.1, our `model.attention_dropout_rate`). `--variant LABEL:PATH=VALUE,...`
(repeatable) times ours with config changes too, e.g. `--variant default: --variant buckets:data.pack_length=0`
(the default packs since 2026-12-02; the committed rounds labelled 'default' ran the buckets).

Useful tokens are target tokens that are not padding (EOS included: both losses count it). Our
rates are an epoch's: each bucket shape is timed on its own real batches (median of `--reps`),
and the epoch's useful (or slot) tokens are divided by the epoch's time, sum over shapes of
batches x step time. The peer's useful rate is its slot rate x the fill of its packed rows.
`--clock cpu` (the default) counts each process's CPU time, so a job sharing the core does not
count; the peer's script is run with `time.perf_counter` pointed at `time.process_time`.
MFU: model FLOPs (XLA's count of our step; for the peer, of our step on its all-real [rows, 64]
shape: the same arithmetic) / step time / the matmul rate measured at the start of the run.
`--matmul_share` then profiles ours: every dot of the compiled step (at the epoch's most frequent
shape) timed alone at its own shapes, against the whole step: what the step's other work costs.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections import defaultdict

import jax

from bench.lib import (
    add_peer_arguments,
    PEER_LENGTH,
    SIZES,
    VOCAB,
    Ours,
    corpus_vocab,
    cpu_description,
    flax_wmt_dir,
    matmul_flops_per_s,
    our_config,
    parse_variant,
    run_peer,
    synthetic_batch,
)
from configs import default
from training.core.markdown import markdown_row, markdown_table
from training.data.batching import as_arrays


def peer_flops(ours: Ours, rows: int) -> float:
    """FLOPs of our step on an all-real [rows, 64] batch: the peer's model arithmetic at its shape."""
    return ours.flops_of(as_arrays(synthetic_batch(rows, PEER_LENGTH, VOCAB)))


def _parse_args() -> argparse.Namespace:
    """The command line, with --wmt_dir resolved (`flax_wmt_dir`); exits where no snapshot is found."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_peer_arguments(parser)
    parser.add_argument(
        "--peer_rows", type=int, default=0, help="the peer's rows of 64 a step (0: its size's, 20 small, 32 base)"
    )
    parser.add_argument(
        "--peer_dtype", default="", help="the peer's compute dtype (default: float32, the example's on CPU)"
    )
    parser.add_argument("--sizes", nargs="*", default=list(SIZES))
    parser.add_argument(
        "--dtypes", nargs="*", default=["float32", "bfloat16"], help="ours (the peer runs float32, as on CPU)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3, help="our timed steps per bucket shape per round")
    parser.add_argument("--peer_steps", type=int, default=0, help="the peer's timed steps (0: small 10, base 5)")
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    parser.add_argument(
        "--matmul_share", action="store_true", help="after the rounds, profile ours: its dots timed alone vs the step"
    )
    parser.add_argument(
        "--variant",
        action="append",
        metavar="LABEL:PATH=VALUE,...",
        help="our config with these changes (repeatable; default: 'default:', the config as it is)",
    )
    args = parser.parse_args()
    args.wmt_dir = flax_wmt_dir(args.wmt_dir)
    if not args.wmt_dir:
        parser.error("no snapshot of Flax's examples/wmt: pass --wmt_dir or set FLAX_WMT_DIR or FLAX_GIT_DIR")
    return args


def main():
    args = _parse_args()
    variants = dict(parse_variant(v) for v in args.variant or ["default:"])
    ours_rows = [(v, d) for v in variants for d in args.dtypes]

    rates = {d: matmul_flops_per_s(jax.numpy.dtype(d), clock=args.clock) for d in ["float32", *args.dtypes]}
    print(cpu_description())
    print(
        f"jax {jax.__version__}, {jax.default_backend()}, clock {args.clock}, ours {variants}; "
        "matmul 2048^3: " + ", ".join(f"{d} {r / 1e9:.0f} GFLOP/s" for d, r in rates.items()),
        flush=True,
    )
    train, vocab = corpus_vocab(default.get_config())
    src_ids, tgt_ids = vocab.encode(list(train.src)), vocab.encode(list(train.tgt))
    ours = {
        (s, v, d): Ours(our_config(s, d, variants[v]), vocab, src_ids, tgt_ids, args.reps)
        for s in args.sizes
        for v, d in ours_rows
    }
    peer_model_flops = {s: peer_flops(ours[(s, *ours_rows[0])], SIZES[s][1]) for s in args.sizes}

    titles = ["round", "size", "side", "dtype", "step s", "slot tok/s", "useful tok/s", "target fill", "shapes", "MFU"]
    print("\n" + markdown_table([*titles, "useful vs peer", "slot vs peer"], [], "rlll" + "r" * 8))
    ratios = defaultdict(list)
    for r in range(args.rounds):
        print(f"<!-- round {r + 1}: load average {os.getloadavg()[0]:.2f} -->", flush=True)
        for size in args.sizes:
            results = {}
            order = ["ours", "peer"] if r % 2 == 0 else ["peer", "ours"]
            for side in order:
                if side == "peer":
                    results["peer"] = run_peer(args, size)
                else:
                    for v, d in ours_rows:
                        results[v, d] = ours[size, v, d].epoch_rates(args.clock)
            peer = results["peer"]

            def row(side, d, step, slot, useful, fill, shapes, mfu, *vs_peer):
                speeds = [f"{step:.3f}", f"{slot:,.0f}", f"{useful:,.0f}", f"{fill:.3f}"]
                print(markdown_row([r + 1, size, side, d, *speeds, shapes, f"{mfu:.0%}", *vs_peer]), flush=True)

            row(
                "flax wmt",
                "float32",
                peer["median_s"],
                peer["slot_tok_s"],
                peer["useful_tok_s"],
                peer["target_nonpad"],
                1,
                peer_model_flops[size] / peer["median_s"] / rates["float32"],
                1,
                1,
            )
            for v, d in ours_rows:
                o = results[v, d]
                useful, slot = o["useful_tok_s"] / peer["useful_tok_s"], o["slot_tok_s"] / peer["slot_tok_s"]
                ratios[size, v, d].append((useful, slot))
                row(
                    f"ours, {v}",
                    d,
                    o["step_s"],
                    o["slot_tok_s"],
                    o["useful_tok_s"],
                    o["fill"],
                    o["shapes"],
                    o["flop_s"] / rates[d],
                    f"{useful:.2f}",
                    f"{slot:.2f}",
                )
    _print_ratios(ratios)
    if args.matmul_share:
        _print_matmul_share(ours, args.clock)


def _print_ratios(ratios: dict) -> None:
    """The rounds' ours-vs-peer ratios, one row per size, variant and dtype: their median and each."""
    vs_peer = [f"{what} tok/s vs peer, median (each)" for what in ("useful", "slot")]
    each = lambda xs: ", ".join(f"{x:.2f}" for x in xs)
    rows = []
    for (size, v, d), pairs in ratios.items():
        useful, slot = zip(*pairs)
        medians = (
            f"**{statistics.median(useful):.2f}** ({each(useful)})",
            f"{statistics.median(slot):.2f} ({each(slot)})",
        )
        rows.append([size, v, d, len(pairs), *medians])
    print("\n" + markdown_table(["size", "ours", "dtype", "rounds", *vs_peer], rows, "lllrrr"))


def _print_matmul_share(ours: dict, clock: str) -> None:
    """Each of our steps profiled: its dots timed alone against the whole step."""
    titles = ["size", "ours", "dtype", "shape", "step s", "its dots alone, s", "dots", "dot share", "dot GFLOP/s"]
    print("\n" + markdown_table([*titles, "rest of the step, s"], [], "llll" + "r" * 6))
    for (size, v, d), o in ours.items():
        p = o.matmul_share(clock)
        shape, step, dots = f"{p['shape'][0]} x {p['shape'][1]}", p["step_s"], p["dots_s"]
        cells = [shape, f"{step:.3f}", f"{dots:.3f}", p["dots"], f"{dots / step:.0%}", f"{p['dot_flop_s'] / 1e9:.0f}"]
        print(markdown_row([size, v, d, *cells, f"{step - dots:.3f}"]), flush=True)


if __name__ == "__main__":
    main()
