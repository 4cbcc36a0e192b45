"""Evaluate a trained workdir: perplexity and sacreBLEU on a split, or translate a text file."""

from __future__ import annotations

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


def evaluate_split(workdir: str | Path, split: str, beam_size: int) -> dict:
    """Perplexity and beam-search sacreBLEU on `split`; hypotheses go to the workdir."""
    run = load_run(workdir)
    return {"step": run.step, **score_split(run, split, beam_size, workdir)}


def score_split(run: LoadedRun, split: str, beam_size: int, workdir: str | Path) -> dict:
    """Perplexity and sacreBLEU of a loaded run on `split`; writes WORKDIR/hypotheses.SPLIT.beamK.txt."""
    corpus = load_corpus(run.config, split)
    nll = dev.dev_loss(run.params, dev_batches(run.config, run.vocab, corpus), dev.eval_step_fn(run.model))
    hyps = run.vocab.decode(_translate(run, run.vocab.encode(list(corpus.src)), beam_size))
    out_path = Path(workdir) / f"hypotheses.{split}.beam{beam_size}.txt"
    out_path.write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    bleu, signature = translate.corpus_bleu(hyps, corpus.tgt)
    return {
        "split": split, "beam_size": beam_size, "loss": nll, "perplexity": dev.perplexity(nll),
        "bleu": bleu, "signature": signature, "hypotheses": str(out_path),
    }


SPEED_EXTRA_LENGTH = 50  # decoding_speed's output cap, source bucket + this: the sweep tables' measure


def decoding_speed(model, params, src_ids, bucket_lengths, beam_sizes=(1, 4), alpha: float = 0.6,
                   max_extra_length: int = SPEED_EXTRA_LENGTH, repeats: int = 3) -> dict:
    """Decode-cache bytes per target token and output tokens/s of greedy and beam search on one batch.

    src_ids: the batch's source token ids (one padded batch at the bucket of the longest). Cache bytes are
    what one target position adds to every decoder layer's K and V, or MLA's latent, per row
    (`decoding.cache_bytes_per_position`; performer's fixed-size state does not grow and is not counted);
    tokens/s counts each sentence's output tokens up to its EOS, median of `repeats` timed runs after a warm-up.
    The loop runs until the batch's last search ends, so the rate mixes step cost with search length: the
    ints `decode_steps_beamK` (decoder steps the loop ran) and `decode_output_tokens_beamK` tell them apart.
    """
    src_ids = [ids[: model.config.max_len] for ids in src_ids]  # over-long inputs: what the model can read, as translate does
    length = bucket_length(max(len(s) for s in src_ids), bucket_lengths)
    src = jnp.asarray(BatchSchedule.assemble(src_ids, [[] for _ in src_ids], len(src_ids), length).src)
    max_len = min(length + max_extra_length, model.config.max_len)
    encoded = model.apply({"params": params}, src, method="encode")
    result = {"kv_cache_bytes_per_token": decoding.cache_bytes_per_position(model, params, encoded, src), "decode_batch": src.shape[0]}
    for beam_size in beam_sizes:
        decode = translate.decoder(model, beam_size, alpha, max_len, return_steps=True)
        tokens, steps = map(np.asarray, decode(params, src))  # compile and warm up
        generated = sum(int(np.argmax(row == model.config.eos_id)) + 1 if model.config.eos_id in row else len(row) for row in tokens)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(decode(params, src))
            times.append(time.perf_counter() - start)
        result[f"decode_tokens_per_s_beam{beam_size}"] = generated / statistics.median(times)
        result[f"decode_output_tokens_beam{beam_size}"] = generated
        result[f"decode_steps_beam{beam_size}"] = int(steps)
    return result


def translate_file(workdir: str | Path, input_path: str | Path, output_path: str | Path, beam_size: int) -> int:
    """Translate a UTF-8 file line by line (blank lines stay blank); returns the number of lines."""
    raw = Path(input_path).read_bytes()
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise ValueError(f"{input_path} is not UTF-8 (line {line}: {error.reason})") from None
    run = load_run(workdir)
    filled = [i for i, line in enumerate(lines) if line.strip()]
    hyps = run.vocab.decode(_translate(run, run.vocab.encode([lines[i].strip() for i in filled]), beam_size)) if filled else []
    out = [""] * len(lines)
    for i, hyp in zip(filled, hyps):
        out[i] = hyp
    Path(output_path).write_text("".join(line + "\n" for line in out), encoding="utf-8")
    return len(lines)


def _translate(run: LoadedRun, src_ids, beam_size):
    config = run.config
    return translate.translate(
        run.model, run.params, src_ids, beam_size=beam_size, alpha=config.eval.alpha,
        max_extra_length=config.eval.max_extra_length, bucket_lengths=config.data.bucket_lengths,
        lengths=eval_lengths(config),
    )
