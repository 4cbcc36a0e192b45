"""Evaluate a trained workdir: perplexity and sacreBLEU on a split, or translate a text file."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import jax
import ml_collections
import sentencepiece as spm

from training import checkpoints, loop, step as step_lib, translate


def load_run(workdir: str | Path):
    """(config, vocabulary, model, params, step) from a workdir, best checkpoint first."""
    workdir = Path(workdir)
    for name in ("config.json", "spm.model"):
        if not (workdir / name).exists():
            raise FileNotFoundError(f"{workdir / name} is missing: is {workdir} a train.py workdir?")
    config = ml_collections.ConfigDict(json.loads((workdir / "config.json").read_text()))
    config.data.bucket_lengths = tuple(config.data.bucket_lengths)
    vocab = spm.SentencePieceProcessor(model_file=str(workdir / "spm.model"))
    model = loop.build_model(config, vocab)
    abstract = step_lib.abstract_state(model, config.optimizer)
    ckpts = checkpoints.Checkpoints(workdir, config.keep_checkpoints)
    state, step = ckpts.restore_for_eval(abstract)
    ckpts.close()
    if state is None:
        raise FileNotFoundError(f"no readable checkpoint in {workdir}/best or {workdir}/checkpoints")
    return config, vocab, model, state.params, step


def evaluate_split(workdir: str | Path, split: str, beam_size: int) -> dict:
    """Perplexity and beam-search sacreBLEU on `split`; hypotheses go to the workdir."""
    config, vocab, model, params, step = load_run(workdir)
    corpus = loop.load_corpus(config, split)
    eval_step = jax.jit(functools.partial(step_lib.eval_step, apply_fn=model.apply))
    nll = loop.dev_loss(params, loop.dev_batches(config, vocab, corpus), eval_step)
    hyps = vocab.decode(_translate(config, model, params, vocab.encode(list(corpus.src)), beam_size))
    out_path = Path(workdir) / f"hypotheses.{split}.beam{beam_size}.txt"
    out_path.write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    bleu, signature = translate.corpus_bleu(hyps, corpus.tgt)
    return {
        "step": step, "split": split, "beam_size": beam_size, "loss": nll, "perplexity": math.exp(nll),
        "bleu": bleu, "signature": signature, "hypotheses": str(out_path),
    }


def translate_file(workdir: str | Path, input_path: str | Path, output_path: str | Path, beam_size: int) -> int:
    """Translate a UTF-8 file line by line (blank lines stay blank); returns the number of lines."""
    raw = Path(input_path).read_bytes()
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise ValueError(f"{input_path} is not UTF-8 (line {line}: {error.reason})") from None
    config, vocab, model, params, _ = load_run(workdir)
    filled = [i for i, line in enumerate(lines) if line.strip()]
    hyps = vocab.decode(_translate(config, model, params, vocab.encode([lines[i].strip() for i in filled]), beam_size)) if filled else []
    out = [""] * len(lines)
    for i, hyp in zip(filled, hyps):
        out[i] = hyp
    Path(output_path).write_text("".join(line + "\n" for line in out), encoding="utf-8")
    return len(lines)


def _translate(config, model, params, src_ids, beam_size):
    return translate.translate(
        model, params, src_ids, beam_size=beam_size, alpha=config.eval.alpha,
        max_extra_length=config.eval.max_extra_length, bucket_lengths=config.data.bucket_lengths,
    )
