"""Multi-query associative recall at long N: which attention-family member can still find a key anywhere in the row.

    taskset -c 1 python -m experiments.associative_recall   # results/attention_family.md (N = 512)
    taskset -c 1 python -m experiments.associative_recall --length 2048   # the long setting, ~2 h a member on one core
    taskset -c 1 python -m experiments.associative_recall --length 128 --steps 20 --types softmax performer
        # a smoke run

The task (multi-query associative recall, after Arora et al. 2023, "Zoology"), generated on the
fly: a row of N tokens holds P pair tokens, each storing one (key, value) binding (distinct keys),
at random positions among noise tokens, and ends with Q queries (keys drawn from the P); the
target at each query is its key's value. A two-layer bidirectional encoder (learned positions,
pre-LN, width 64, 4 heads) built from `attention.MultiHeadAttention(attention_type=...)` is trained
from scratch for each member with the same data, steps and seed, and scored on fresh rows: the
share of queries answered (chance 1 / keys). Exact attention solves it with one content lookup;
approximations that blur or drop far tokens do not. Members run with
`experiments.lib.member_options` at this N, except that span may learn to reach the whole
row (max_span = N: the task is long-range by construction).

One token a binding, not Zoology's key and value as two tokens: that form needs a
previous-token head before the lookup and did not learn on this CPU's budget (N = 256, 800 steps
of 16 rows: 0.03 query accuracy, chance 1/64), while this one reaches 0.57 in 300 steps at N = 128
and 0.75 in 800 steps at N = 512 (softmax). N = 2048 costs ~5 s a softmax step here (dense
[8, 4, 2048, 2048] scores, two layers), so the committed table is at N = 512.
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

from attention import family
from experiments.lib import evaluate, final_loss, fit, member_encoder, member_options
from training.core.markdown import markdown_row, markdown_table


def vocabulary(num_keys: int, num_values: int, num_noise: int) -> dict:
    """Token ids: keys 1..K (the queries), values K+1..K+V (the answers), one token per (key, value) pair, then
    noise; 0 is never drawn."""
    keys = np.arange(1, num_keys + 1)
    values = np.arange(num_keys + 1, num_keys + num_values + 1)
    pair_base = num_keys + num_values + 1
    noise = np.arange(pair_base + num_keys * num_values, pair_base + num_keys * num_values + num_noise)
    return {"keys": keys, "values": values, "pair_base": pair_base, "noise": noise, "size": int(noise[-1]) + 1}


def pair_token(vocab: dict, key, value):
    """The one token that stores `key` -> `value`."""
    num_values = len(vocab["values"])
    return vocab["pair_base"] + (key - vocab["keys"][0]) * num_values + (value - vocab["values"][0])


def make_batch(rng: np.random.Generator, vocab: dict, rows: int, length: int, pairs: int, queries: int):
    """tokens `[rows, length]` int32, targets `[rows, length]` (the value at each query, 0 elsewhere), query mask."""
    if pairs + queries > length or pairs > len(vocab["keys"]):
        raise ValueError(
            f"length = {length}, pairs = {pairs}, queries = {queries}: need pairs + queries <= length "
            f"and pairs <= {len(vocab['keys'])} keys"
        )
    tokens = rng.choice(vocab["noise"], size=(rows, length))
    targets = np.zeros((rows, length), np.int32)
    for r in range(rows):
        keys = rng.choice(vocab["keys"], size=pairs, replace=False)
        values = rng.choice(vocab["values"], size=pairs)
        tokens[r, rng.choice(length - queries, size=pairs, replace=False)] = pair_token(vocab, keys, values)
        asked = rng.integers(0, pairs, size=queries)
        tokens[r, length - queries :] = keys[asked]
        targets[r, length - queries :] = values[asked]
    return tokens.astype(np.int32), targets, targets > 0


def train_and_score(attention_type: str, args, vocab: dict) -> dict:
    """Train one member from the shared seed; return its query accuracy on fresh rows, final loss and seconds."""
    options = {} if attention_type == "softmax" else member_options(attention_type, args.length)
    if attention_type == "span":
        options["max_span"] = args.length
    model = member_encoder(attention_type, options, vocab["size"], args.length)
    data = np.random.default_rng(args.seed)  # the same rows, in the same order, for every member
    batch = lambda rows: make_batch(data, vocab, rows, args.length, args.pairs, args.queries)
    tokens, _, _ = batch(1)
    params = jax.jit(model.init)(jax.random.key(args.seed), tokens)
    params, losses, seconds = fit(model, params, lambda: batch(args.batch), args.steps, args.learning_rate)
    scores = evaluate(model, params, (batch(args.batch) for _ in range(args.eval_rows // args.batch)))
    return {"accuracy": scores["accuracy"], "final_loss": final_loss(losses), "seconds": seconds}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--keys", type=int, default=16, help="distinct keys and values (chance = 1/keys)")
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--queries", type=int, default=16)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--learning_rate", type=float, default=3e-3)
    parser.add_argument("--eval_rows", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--types",
        nargs="*",
        default=[t for t in family.ATTENTION_TYPES if t != "mla"],
        help="members to train (mla's attention is exact: its gain is the cache)",
    )
    args = parser.parse_args()
    vocab = vocabulary(num_keys=args.keys, num_values=args.keys, num_noise=16)
    print(
        f"MQAR: N = {args.length}, {args.pairs} pairs, {args.queries} queries, {args.steps} steps of "
        f"{args.batch} rows, seed {args.seed}; chance = 1/{args.keys}\n"
    )
    print(markdown_table(["attention_type", "query accuracy", "final train loss", "train CPU s"], [], "lrrr"))
    for attention_type in args.types:
        result = train_and_score(attention_type, args, vocab)
        scores = [f"{result['accuracy']:.3f}", f"{result['final_loss']:.3f}", f"{result['seconds']:.0f}"]
        print(markdown_row([attention_type, *scores]), flush=True)


if __name__ == "__main__":
    main()
