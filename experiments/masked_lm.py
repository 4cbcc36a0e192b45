"""Masked-LM perplexity at N = 512: Linformer's own quality claim, "k = 128 within 1 % of full attention".

    taskset -c 1 python -m experiments.masked_lm   # results/attention_family.md (the claims table)
    taskset -c 1 python -m experiments.masked_lm --length 128 --steps 20 --projected_lengths 32   # a smoke run

Each row trains from the same seed, rows and masks, so rows can run as separate processes
(`--projected_lengths` with no value: softmax alone; `--no-softmax`: the Linformer rows alone).
`--projection_init pooling` starts E and F as window means (the identity at k = N) instead of noise;
`--projection_lr_scale` scales their learning rate (0 keeps them fixed: the paper's §4 pooling).

Linformer (Wang et al. 2020, fig. 3) pretrains masked LMs at n = 512 and finds the validation
perplexity of k = 128 close to full attention's. The same kind of test at this CPU's scale: the
English side of Multi30k (read from `$MULTI30K_DIR`, as training does), tokenised with the
project's SentencePiece unigram vocabulary trained on that text (128 pieces: characters and common
short words), sentences joined with EOS into one stream. Training rows are N tokens at random
offsets of the train stream; a `--mask_rate` share of each row's positions is replaced by a [MASK]
id (BERT's masking, without its 10 % random and 10 % kept tokens) and predicted. The model is
`experiments.lib`'s two-layer encoder, the same for every member and seed. Scored on the val
and test_2016_flickr streams cut into consecutive rows, each masked `--eval_masks` times with
draws fixed for every member and seed: masked-token perplexity and accuracy. Linformer rows differ
from the softmax row only in the attention (E and F of `[k, N]`, shared by the heads, as in
`bench/attention_family.py`).

A masked LM first sits at the unigram perplexity (47 with these pieces) until attention learns to
read the neighbours; at N = 128 that took between 1,500 steps (PPL 44-47 at lr 1e-3 to 1e-2) and
4,000 (7.5), hence 5,000 steps here. With 2,000 pieces it was still at unigram after 2,000 steps.
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

from experiments.lib import evaluate, final_loss, fit, member_encoder, member_options
from models.tokens import EOS_ID
from training.core.markdown import markdown_row, markdown_table
from training.data import tokenizer
from training.data.corpus import default_multi30k_dir, load_multi30k

EVAL_SPLITS = ("val", "test_2016_flickr")


def token_stream(vocab, sentences) -> np.ndarray:
    """Every sentence's ids followed by EOS, as one int32 array."""
    return np.asarray([i for ids in vocab.encode(list(sentences)) for i in [*ids, EOS_ID]], np.int32)


def mask_rows(rng: np.random.Generator, rows: np.ndarray, rate: float, mask_id: int):
    """(tokens with `round(rate * N)` positions a row set to `mask_id`, the original rows as targets, the masked
    positions)."""
    num_rows, length = rows.shape
    masked = np.zeros(rows.shape, bool)
    count = max(1, round(rate * length))
    for r in range(num_rows):
        masked[r, rng.choice(length, size=count, replace=False)] = True
    return np.where(masked, mask_id, rows).astype(np.int32), rows.astype(np.int32), masked


def train_rows(rng: np.random.Generator, stream: np.ndarray, rows: int, length: int) -> np.ndarray:
    """`rows` windows of `length` tokens at random offsets of `stream`: `[rows, length]`."""
    if len(stream) < length:
        raise ValueError(f"length = {length} exceeds the training stream ({len(stream)} tokens)")
    starts = rng.integers(0, len(stream) - length + 1, size=rows)
    return np.stack([stream[s : s + length] for s in starts])


def eval_rows(stream: np.ndarray, length: int) -> np.ndarray:
    """`stream` cut into consecutive rows of `length` (the tail shorter than a row is left out): `[rows, length]`."""
    num_rows = len(stream) // length
    if num_rows == 0:
        raise ValueError(f"length = {length} exceeds the evaluation stream ({len(stream)} tokens)")
    return stream[: num_rows * length].reshape(num_rows, length)


def eval_batches(rows: np.ndarray, args, mask_id: int) -> list:
    """The scored batches of one split: every row masked `args.eval_masks` times, the same draws for every run."""
    rng = np.random.default_rng(0)
    masked = [mask_rows(rng, rows, args.mask_rate, mask_id) for _ in range(args.eval_masks)]
    return [
        tuple(np.concatenate([m[i] for m in masked])[s : s + args.batch] for i in range(3))
        for s in range(0, len(rows) * args.eval_masks, args.batch)
    ]


def train_and_score(name: str, options: dict, streams: dict, args, vocab_size: int) -> dict:
    """Train one attention setting from `args.seed`; its masked-token perplexity and accuracy per eval split."""
    attention_type = "softmax" if name == "softmax" else "linformer"
    mask_id = vocab_size - 1
    model = member_encoder(attention_type, options, vocab_size, args.length, positions="sinusoidal")
    data = np.random.default_rng(args.seed)  # the same rows and masks, in the same order, for every setting
    batch = lambda: mask_rows(
        data,
        train_rows(data, streams["train"], args.batch, args.length),
        args.mask_rate,
        mask_id,
    )
    params = jax.jit(model.init)(jax.random.key(args.seed), np.zeros((1, args.length), np.int32))
    scales = {} if name == "softmax" else {"E": args.projection_lr_scale, "F": args.projection_lr_scale}
    params, losses, seconds = fit(model, params, batch, args.steps, args.learning_rate, scales)
    result = {"final_loss": final_loss(losses), "seconds": seconds}
    for split in EVAL_SPLITS:
        result[split] = evaluate(model, params, eval_batches(eval_rows(streams[split], args.length), args, mask_id))
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument(
        "--projected_lengths",
        type=int,
        nargs="*",
        default=[128],
        help="Linformer's k, one row each (beside exact softmax)",
    )
    parser.add_argument("--language", default="en")
    parser.add_argument("--vocab_size", type=int, default=128)
    parser.add_argument("--mask_rate", type=float, default=0.15)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--learning_rate", type=float, default=3e-3)
    parser.add_argument("--eval_masks", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--projection_init",
        default="uniform",
        choices=["uniform", "pooling"],
        help="Linformer's E and F at the start: noise (the reference's) or window means (the identity at k = N)",
    )
    parser.add_argument(
        "--projection_lr_scale",
        type=float,
        default=1.0,
        help="Linformer's E and F learn at this times the learning rate (0: fixed at their init)",
    )
    parser.add_argument(
        "--softmax",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="train the exact-softmax row (--no-softmax: only the Linformer rows, e.g. on another core)",
    )
    args = parser.parse_args()
    if not 0 < args.mask_rate < 1:
        raise ValueError(f"--mask_rate must be in (0, 1), got {args.mask_rate}")
    if not args.softmax and not args.projected_lengths:
        parser.error("--no-softmax with no --projected_lengths leaves nothing to train")
    if args.projection_lr_scale < 0:
        parser.error(f"--projection_lr_scale must be >= 0, got {args.projection_lr_scale}")
    other = "de" if args.language != "de" else "en"
    text = {
        split: load_multi30k(default_multi30k_dir(), split, other, args.language).tgt
        for split in ("train", *EVAL_SPLITS)
    }
    vocab = tokenizer.load(tokenizer.train(text["train"], args.vocab_size, seed=0))
    streams = {split: token_stream(vocab, sentences) for split, sentences in text.items()}
    vocab_size = vocab.get_piece_size() + 1  # the last id is [MASK]
    settings = {"softmax": {}} if args.softmax else {}
    for k in args.projected_lengths:
        name = (
            f"linformer k = {k}"
            + ("" if args.projection_init == "uniform" else f", {args.projection_init} init")
            + ("" if args.projection_lr_scale == 1 else f", E/F lr × {args.projection_lr_scale:g}")
        )
        settings[name] = {
            **member_options("linformer", args.length),
            "projected_length": k,
            "projection_init": args.projection_init,
        }
    print(
        f"Masked LM on Multi30k {args.language}: N = {args.length}, vocabulary {vocab_size}, "
        f"{len(streams['train']):,} train tokens, {args.steps} steps of {args.batch} rows, "
        f"mask rate {args.mask_rate}, seed {args.seed}\n"
    )
    titles = ["attention", "val masked PPL", "val accuracy", "test masked PPL", "test accuracy", "final train loss"]
    print(markdown_table([*titles, "train CPU s"], [], "l" + "r" * 6))
    for name, options in settings.items():
        r = train_and_score(name, options, streams, args, vocab_size)
        val, test = r["val"], r["test_2016_flickr"]
        scores = [cell for s in (val, test) for cell in (f"{np.exp(s['loss']):.3f}", f"{s['accuracy']:.4f}")]
        print(markdown_row([name, *scores, f"{r['final_loss']:.4f}", f"{r['seconds']:.0f}"]), flush=True)
    print(f"\n(scored positions: val {r['val']['scored']:,}, test {r['test_2016_flickr']['scored']:,})")


if __name__ == "__main__":
    main()
