"""The dev-set numbers a run reports: per-token loss over fixed-shape batches, perplexity, greedy BLEU."""

from __future__ import annotations

import functools
import math
import sys

import jax

from training.data.batching import eval_lengths
from training.evaluation import translate
from training.run import step as step_lib


def eval_step_fn(model):
    """`step.eval_step` jitted for `model`: params, batch -> {nll_sum, tokens}."""
    return jax.jit(functools.partial(step_lib.eval_step, apply_fn=model.apply))


def dev_loss(params, batches, eval_step) -> float:
    """Mean per-token NLL over fixed-shape batches."""
    sums = [eval_step(params, b) for b in batches]
    return sum(float(s["nll_sum"]) for s in sums) / sum(float(s["tokens"]) for s in sums)


def perplexity(nll: float) -> float:
    """exp(nll); inf where that overflows a float (a diverged model), rather than an OverflowError."""
    return math.exp(nll) if nll < math.log(sys.float_info.max) else math.inf


def dev_metrics(config, model, params, vocab, dev, batches, eval_step, step) -> dict:
    """Dev loss and perplexity over the whole dev split; greedy sacreBLEU on its first `eval.bleu_examples`."""
    nll = dev_loss(params, batches, eval_step)
    n = config.eval.bleu_examples or len(dev)
    hyps = translate.translate(
        model, params, vocab.encode(list(dev.src[:n])), beam_size=1, alpha=config.eval.alpha,
        max_extra_length=config.eval.max_extra_length, bucket_lengths=config.data.bucket_lengths,
        lengths=eval_lengths(config),
    )
    bleu, _ = translate.corpus_bleu(vocab.decode(hyps), dev.tgt[:n])
    return {"step": step, "split": config.data.eval_split, "loss": nll, "perplexity": perplexity(nll), "bleu": bleu, "bleu_examples": n}
