"""The dev-set numbers a run reports: per-token loss over fixed-shape batches, perplexity, greedy BLEU."""

from __future__ import annotations

import functools
import math
import sys

import jax

import backends
from training.core import step as step_lib
from training.data.batching import eval_lengths
from training.evaluation import translate


ROWS = 64  # sentences a translation batch (translate's default)


def eval_step_fn(model):
    """`step.eval_step` jitted for `model`: params, batch -> {nll_sum, tokens}."""
    return jax.jit(
        functools.partial(
            step_lib.eval_step, apply_fn=model.apply, pick=backends.target_logits(backends.platform_of(model))
        )
    )


class Stopped(Exception):
    """A stop signal came between two evaluation batches."""


def until_stopped(batches, stop):
    """`batches`, raising Stopped before the next one once `stop()` is true (None: never)."""
    for batch in batches:
        if stop is not None and stop():
            raise Stopped
        yield batch


def dev_loss(params, batches, eval_step) -> float:
    """Mean per-token NLL over fixed-shape batches."""
    sums = [eval_step(params, b) for b in batches]
    return sum(float(s["nll_sum"]) for s in sums) / sum(float(s["tokens"]) for s in sums)


def perplexity(nll: float) -> float:
    """exp(nll); inf where that overflows a float (a diverged model), rather than an OverflowError."""
    return math.exp(nll) if nll < math.log(sys.float_info.max) else math.inf


def dev_metrics(config, model, params, vocab, dev, batches, eval_step, step, stop=None) -> dict | None:
    """Dev loss and perplexity over the whole dev split; greedy sacreBLEU on its first `eval.bleu_examples`.

    stop: checked between batches (loss and translation), so a SIGTERM waits for one batch, not the
    whole evaluation; None is returned if it turns true.
    """
    try:
        nll = dev_loss(params, until_stopped(batches, stop), eval_step)
        n = config.eval.bleu_examples or len(dev)
        src = vocab.encode(list(dev.src[:n]))
        # translate's own grouping (by length, ROWS a batch), one call a batch so that a stop can come in between
        order = sorted(range(n), key=lambda i: len(src[i][: model.config.max_len]))
        chunks = [order[start : start + ROWS] for start in range(0, n, ROWS)]
        hyps = [None] * n
        for chunk in until_stopped(chunks, stop):
            out = translate.translate(
                model,
                params,
                [src[i] for i in chunk],
                beam_size=1,
                alpha=config.eval.alpha,
                max_extra_length=config.eval.max_extra_length,
                bucket_lengths=config.data.bucket_lengths,
                rows=ROWS,
                lengths=eval_lengths(config),
            )
            for i, ids in zip(chunk, out):
                hyps[i] = ids
    except Stopped:
        return None
    bleu, _ = translate.corpus_bleu(vocab.decode(hyps), dev.tgt[:n])
    return {
        "step": step,
        "split": config.data.eval_split,
        "loss": nll,
        "perplexity": perplexity(nll),
        "bleu": bleu,
        "bleu_examples": n,
    }
