"""Training speed of every attention_type on the family sweep's own config, side by side in one sitting.

    MULTI30K_DIR=... taskset -c 1 python -m bench.family_step --vocab results/family/spm.model --rounds 3

results/family.md's train tokens/s is each point's own run, timed on whichever machine ran it and
beside whatever else ran there, so between members it compares sittings as much as methods. This
times every member's compiled train step (configs/ablation_family.py: its sizes, options, dtype
and matmuls) on real Multi30k batches, one process on one core: for each bucket length that holds
at least `--min_share` of an epoch's batches, the bucket's first batch is timed, and a member's
rate is the target tokens of those buckets' batches over the time their steps take (each bucket's
step time times its batch count). Members run in an order rotated every round; each rate is also
a ratio to softmax's in the same round, and the table gives the median ratio over rounds.
"""

from __future__ import annotations

import argparse
import functools
import statistics

import jax
import numpy as np

from bench.lib import cpu_description, median_seconds
from configs import ablation_family
from training import config as config_lib
from training.data import tokenizer
from training.data.batching import Batch, BatchSchedule, as_arrays
from training.data.corpus import load_corpus
from training.core import step as step_lib
from training.core.markdown import markdown_row, markdown_table
from sweeps.store import git_commit


def buckets_timed(config, vocab, min_share: float) -> list[tuple[Batch, int, int]]:
    """[(first batch, batches an epoch, target tokens an epoch)] of each bucket with >= min_share of the batches."""
    train = load_corpus(config, config.data.train_split)
    src_ids, tgt_ids = vocab.encode(list(train.src)), vocab.encode(list(train.tgt))
    schedule = BatchSchedule(
        src_ids,
        tgt_ids,
        token_budget=config.data.token_budget,
        bucket_lengths=config.data.bucket_lengths,
        seed=config.seed,
    )
    timed = []
    for length, rows, ids in schedule.buckets:
        batches = -(-len(ids) // rows)
        if batches and batches / schedule.batches_per_epoch >= min_share:
            first = ids[:rows]
            batch = schedule.assemble([src_ids[i] for i in first], [tgt_ids[i] for i in first], rows, length)
            timed.append((batch, batches, sum(len(tgt_ids[i]) + 1 for i in ids)))
    return timed


def member_step(config, vocab, batch: Batch):
    """(train state, jitted train step) for the model `config` describes, as the training loop builds them."""
    model = config_lib.build_model(config, vocab)
    tx = step_lib.make_optimizer(config.optimizer, config.num_train_steps)
    state = jax.jit(lambda: step_lib.create_state(model, tx, jax.random.key(0), batch))()
    return state, jax.jit(functools.partial(step_lib.train_step, label_smoothing=config.optimizer.label_smoothing))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", required=True, help="the sweep's SentencePiece model (results/family/spm.model)")
    parser.add_argument("--members", nargs="+", default=list(ablation_family.SWEEP_VALUES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=5, help="timed steps a batch, after 2 warm-up steps")
    parser.add_argument(
        "--min_share", type=float, default=0.02, help="time the buckets with at least this share of an epoch's batches"
    )
    args = parser.parse_args()
    unknown = sorted(set(args.members) - set(ablation_family.OPTIONS))
    if unknown or "softmax" not in args.members:
        parser.error(f"--members: got {args.members}; expected softmax and others of {tuple(ablation_family.OPTIONS)}")

    configs = {m: ablation_family.get_config(f"attention={m}") for m in args.members}
    vocab = tokenizer.load(open(args.vocab, "rb").read())
    timed = buckets_timed(configs["softmax"], vocab, args.min_share)
    tokens = sum(t for _, _, t in timed)
    model = configs["softmax"].model
    print(f"{cpu_description()}; {git_commit()}")
    print(
        f"jax {jax.__version__}, {jax.default_backend()}, wall clock; dtype {model.dtype}, matmul {model.matmul}; "
        f"buckets timed (length x rows: batches an epoch) "
        + ", ".join(f"{b.src.shape[1]} x {b.src.shape[0]}: {n}" for b, n, _ in timed)
        + f"; median of {args.reps} steps a batch\n"
    )

    batches = [as_arrays(b) for b, _, _ in timed]
    counts = np.array([n for _, n, _ in timed])
    steps = {m: member_step(configs[m], vocab, timed[0][0]) for m in args.members}
    rates = {m: [] for m in args.members}
    titles = ["round", "attention_type", "epoch seconds (timed buckets)", "target tokens/s", "vs softmax"]
    print(markdown_table(titles, [], "rlrrr"))
    for r in range(args.rounds):
        order = [args.members[(i + r) % len(args.members)] for i in range(len(args.members))]
        for m in order:
            state, step = steps[m]
            seconds = [
                median_seconds(lambda s, b=b: step(s, b, jax.random.key(1))[1]["loss"], (state,), args.reps)
                for b in batches
            ]
            rates[m].append(tokens / float(counts @ np.array(seconds)))
        for m in args.members:
            rate, vs = rates[m][-1], rates[m][-1] / rates["softmax"][-1]
            print(markdown_row([r, m, f"{tokens / rate:.1f}", f"{rate:,.0f}", f"{vs:.2f}x"]), flush=True)
    medians = []
    for m in args.members:
        ratio = statistics.median(a / b for a, b in zip(rates[m], rates["softmax"]))
        medians.append([m, f"{statistics.median(rates[m]):,.0f}", f"{ratio:.2f}x"])
    titles = ["attention_type", "target tokens/s (median)", "vs softmax (median of rounds)"]
    print("\n" + markdown_table(titles, medians, "lrr"))


if __name__ == "__main__":
    main()
