"""Batch translation of token-id sentences with greedy or beam search, and corpus BLEU."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import numpy as np
import sacrebleu

from models import beam_search, greedy_decode
from training.core.progress import Bar
from training.data.batching import BatchSchedule, bucket_length


def translate(
    model,
    params,
    src_ids: Sequence[Sequence[int]],
    *,
    beam_size: int,
    alpha: float,
    max_extra_length: int,
    bucket_lengths: Sequence[int],
    rows: int = 64,
    lengths: Sequence[int] = (),
    progress: str | None = None,
) -> list[list[int]]:
    """Token ids of each translation (EOS and padding removed), in input order.

    Sources are cut to the model's max_len, grouped by bucket length and padded to `rows` rows, so each bucket
    compiles once; output length is capped at bucket length + `max_extra_length` (and the model's max_len).
    `lengths` (config.eval.lengths; () = the buckets): a few fixed source lengths the batches are padded
    to instead, each one compiled program whose output capacity is that length + `max_extra_length`;
    the cap stays the bucket's (passed to the program as a number), so the translations are those of
    the bucketed path (up to float rounding over the extra, masked padding).
    `progress`: a bar's label, the sentences counted batch by batch (drawn where stderr is a terminal); None, no bar.
    """
    eos, pad = model.config.eos_id, model.config.pad_id
    src_ids = [ids[: model.config.max_len] for ids in src_ids]  # over-long inputs: what the model can read
    order = sorted(range(len(src_ids)), key=lambda i: len(src_ids[i]))
    results: list[list[int]] = [[] for _ in src_ids]
    with Bar(total=len(order), desc=progress, unit="sentence", disable=True if progress is None else None) as bar:
        for start in range(0, len(order), rows):
            chunk = order[start : start + rows]
            longest = max(len(src_ids[i]) for i in chunk)
            length = bucket_length(longest, bucket_lengths)
            max_len = min(length + max_extra_length, model.config.max_len)
            if lengths:
                padded = bucket_length(length, lengths)
                capacity = max(min(padded + max_extra_length, model.config.max_len), max_len)
                batch = BatchSchedule.assemble([src_ids[i] for i in chunk], [[] for _ in chunk], rows, padded)
                limited = decoder(model, beam_size, alpha, capacity, limited=True)
                tokens = np.asarray(limited(params, batch.src, np.int32(max_len)))
            else:
                batch = BatchSchedule.assemble([src_ids[i] for i in chunk], [[] for _ in chunk], rows, length)
                tokens = np.asarray(decoder(model, beam_size, alpha, max_len)(params, batch.src))
            for row, i in enumerate(chunk):
                out = list(tokens[row])
                out = out[: out.index(eos)] if eos in out else out
                results[i] = [t for t in out if t != pad]
            bar.update(len(chunk))
    return results


@functools.lru_cache(maxsize=32)
def decoder(model, beam_size, alpha, max_len, return_steps=False, limited=False):
    """A jitted decode of a source batch to tokens [B, max_len]; with `return_steps`, (tokens, loop steps).

    `limited`: the function takes a third argument, the output cap ([] int32, <= max_len; see `greedy_decode`).
    """
    if beam_size == 1:

        def decode(params, src, limit=None):
            return greedy_decode(model, params, src, max_len, return_steps=return_steps, limit=limit)
    else:

        def decode(params, src, limit=None):
            tokens, _, *steps = beam_search(
                model,
                params,
                src,
                beam_size=beam_size,
                alpha=alpha,
                max_len=max_len,
                return_steps=return_steps,
                limit=limit,
            )
            return (tokens, *steps) if return_steps else tokens

    return jax.jit(decode) if limited else jax.jit(lambda params, src: decode(params, src))


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[float, str]:
    """(sacreBLEU score, its signature): 13a tokenisation, cased, on detokenised text."""
    metric = sacrebleu.metrics.BLEU()
    score = metric.corpus_score(list(hypotheses), [list(references)])
    return score.score, str(metric.get_signature())
