"""Evaluate a trained workdir: perplexity and sacreBLEU on a split, or translate a text file."""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from models import decoding
from training.data.batching import BatchSchedule, bucket_length, dev_batches, eval_lengths
from training.data.corpus import load_corpus
from training.evaluation import dev, translate
from training.evaluation.loaded import LoadedRun, load_run


def hypotheses_path(workdir: str | Path, split: str, beam_size: int) -> Path:
    """Where `score_split` writes a split's translations by default: WORKDIR/hypotheses.SPLIT.beamK.txt."""
    return Path(workdir) / f"hypotheses.{split}.beam{beam_size}.txt"


def evaluate_split(
    workdir: str | Path, split: str, beam_size: int, hypotheses: str | Path | None = None, report=None
) -> dict:
    """Perplexity and beam-search sacreBLEU on `split` of the workdir's best (else latest) checkpoint, as
    `score_split`."""
    run = load_run(workdir)
    return score_split(run, split, beam_size, workdir, hypotheses, report)


def score_split(
    run: LoadedRun, split: str, beam_size: int, workdir: str | Path, hypotheses: str | Path | None = None, report=None
) -> dict:
    """Perplexity and sacreBLEU of a loaded run on `split` (and the step and checkpoint scored).

    The translations go to `hypotheses` (default `hypotheses_path`) after `report(result)` has been
    given the score, so an unwritable path loses no score.
    """
    corpus = load_corpus(run.config, split)
    nll = dev.dev_loss(run.params, dev_batches(run.config, run.vocab, corpus), dev.eval_step_fn(run.model))
    hyps = run.vocab.decode(_translate(run, run.vocab.encode(list(corpus.src)), beam_size, split))
    out_path = Path(hypotheses) if hypotheses else hypotheses_path(workdir, split, beam_size)
    bleu, signature = translate.corpus_bleu(hyps, corpus.tgt)
    result = {
        "step": run.step,
        "checkpoint": str(run.checkpoint),
        "split": split,
        "beam_size": beam_size,
        "loss": nll,
        "perplexity": dev.perplexity(nll),
        "bleu": bleu,
        "signature": signature,
        "hypotheses": str(out_path),
    }
    if report is not None:
        report(result)
    out_path.write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    return result


SPEED_EXTRA_LENGTH = 50  # decoding_speed's output cap, source bucket + this: the sweep tables' measure


def decoding_speed(
    model,
    params,
    src_ids,
    bucket_lengths,
    beam_sizes=(1, 4),
    alpha: float = 0.6,
    max_extra_length: int = SPEED_EXTRA_LENGTH,
    repeats: int = 3,
) -> dict:
    """Decode-cache bytes per target token and output tokens/s of greedy and beam search on one batch.

    src_ids: the batch's source token ids (one padded batch at the bucket of the longest). Cache bytes are
    what one target position adds to every decoder layer's K and V, or MLA's latent, per row
    (`decoding.cache_bytes_per_position`; performer's fixed-size state does not grow and is not counted);
    tokens/s counts each sentence's output tokens up to its EOS, median of `repeats` timed runs after a warm-up.
    The loop runs until the batch's last search ends, so the rate mixes step cost with search length: the
    ints `decode_steps_beamK` (decoder steps the loop ran) and `decode_output_tokens_beamK` tell them apart.
    """
    src_ids = [
        ids[: model.config.max_len] for ids in src_ids
    ]  # over-long inputs: what the model can read, as translate does
    length = bucket_length(max(len(s) for s in src_ids), bucket_lengths)
    src = jnp.asarray(BatchSchedule.assemble(src_ids, [[] for _ in src_ids], len(src_ids), length).src)
    max_len = min(length + max_extra_length, model.config.max_len)
    encoded = model.apply({"params": params}, src, method="encode")
    result = {
        "kv_cache_bytes_per_token": decoding.cache_bytes_per_position(model, params, encoded, src),
        "decode_batch": src.shape[0],
    }
    for beam_size in beam_sizes:
        decode = translate.decoder(model, beam_size, alpha, max_len, return_steps=True)
        tokens, steps = map(np.asarray, decode(params, src))  # compile and warm up
        generated = sum(
            int(np.argmax(row == model.config.eos_id)) + 1 if model.config.eos_id in row else len(row) for row in tokens
        )
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(decode(params, src))
            times.append(time.perf_counter() - start)
        result[f"decode_tokens_per_s_beam{beam_size}"] = generated / statistics.median(times)
        result[f"decode_output_tokens_beam{beam_size}"] = generated
        result[f"decode_steps_beam{beam_size}"] = int(steps)
    return result


def translate_file(
    workdir: str | Path, input_path: str | Path, output_path: str | Path, beam_size: int, run: LoadedRun | None = None
) -> int:
    """Translate a UTF-8 file line by line (blank lines stay blank); returns the number of lines.

    run: the workdir already loaded (else it is loaded here). Lines longer than the model's max_len are
    cut to it, and a warning says how many and which.
    """
    raw = Path(input_path).read_bytes()
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise ValueError(f"{input_path} is not UTF-8 (line {line}: {error.reason})") from None
    run = run or load_run(workdir)
    filled = [i for i, line in enumerate(lines) if line.strip()]
    src_ids = run.vocab.encode([lines[i].strip() for i in filled])
    limit = run.model.config.max_len
    if cut := [filled[k] + 1 for k, ids in enumerate(src_ids) if len(ids) > limit]:
        logging.warning(
            "%d of %d lines of %s are longer than the model's max_len (%d tokens) and were cut to it: line %s",
            len(cut),
            len(lines),
            input_path,
            limit,
            ", ".join(map(str, cut[:10])) + (" ..." if len(cut) > 10 else ""),
        )
    hyps = run.vocab.decode(_translate(run, src_ids, beam_size, Path(input_path).name)) if filled else []
    out = [""] * len(lines)
    for i, hyp in zip(filled, hyps):
        out[i] = hyp
    Path(output_path).write_text("".join(line + "\n" for line in out), encoding="utf-8")
    return len(lines)


def _translate(run: LoadedRun, src_ids, beam_size, what: str):
    """The translations of `src_ids` (token ids) by the run's model, a bar labelled with `what` counting them (on a
    terminal)."""
    config = run.config
    return translate.translate(
        run.model,
        run.params,
        src_ids,
        beam_size=beam_size,
        alpha=config.eval.alpha,
        max_extra_length=config.eval.max_extra_length,
        bucket_lengths=config.data.bucket_lengths,
        lengths=eval_lengths(config),
        progress=f"translating {what} ({'greedy' if beam_size == 1 else f'beam {beam_size}'})",
    )
