"""A trained run plus a fixed dev subset, and the dev loss / BLEU every analysis reports."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from training.data.batching import dev_batches
from training.data.corpus import Corpus, load_corpus
from training.evaluation import dev, translate
from training.evaluation.loaded import load_run


@dataclasses.dataclass(frozen=True)
class Run:
    """What `training.evaluation.loaded.LoadedRun` holds, and where the analyses write."""

    config: Any
    vocab: Any
    model: Any
    params: Any
    step: int
    workdir: Path
    checkpoint: Path | None = None  # the folder of the step loaded

    @property
    def out_dir(self) -> Path:
        path = self.workdir / "analysis"
        path.mkdir(parents=True, exist_ok=True)
        return path


def load(workdir: str | Path, cache: Path | None = None) -> Run:
    """The workdir's best checkpoint (else its latest), as `eval.py` loads it (cache: `load_run`'s)."""
    loaded = load_run(workdir, cache)
    return Run(
        loaded.config,
        loaded.vocab,
        loaded.model,
        loaded.params,
        loaded.step,
        workdir=Path(workdir),
        checkpoint=loaded.checkpoint,
    )


def dev_subset(config, split: str, size: int, start: int = 0) -> Corpus:
    """Pairs `start` .. `start + size` of `split` (to its end when size is 0): the same subset on every call."""
    if size < 0 or start < 0:
        raise ValueError(f"the subset needs size >= 0 (0: to the end) and start >= 0, got size {size}, start {start}")
    corpus = load_corpus(config, split)
    end = start + size if size else len(corpus)
    if start >= len(corpus):
        raise ValueError(f"split {split!r} has {len(corpus)} pairs; a subset starting at {start} is empty")
    return Corpus(corpus.src[start:end], corpus.tgt[start:end], corpus.dropped)


def scorer(config, vocab, model, corpus: Corpus, beam_size: int = 1):
    """A function params -> {"loss": dev NLL per token, "bleu": sacreBLEU} on `corpus` (compiled once)."""
    batches = dev_batches(config, vocab, corpus)
    eval_step = dev.eval_step_fn(model)
    src_ids = vocab.encode(list(corpus.src))

    def score(params) -> dict:
        hyps = translate.translate(
            model,
            params,
            src_ids,
            beam_size=beam_size,
            alpha=config.eval.alpha,
            max_extra_length=config.eval.max_extra_length,
            bucket_lengths=config.data.bucket_lengths,
        )
        bleu, _ = translate.corpus_bleu(vocab.decode(hyps), corpus.tgt)
        return {"loss": dev.dev_loss(params, batches, eval_step), "bleu": bleu}

    return score
