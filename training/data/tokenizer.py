"""A joint source/target SentencePiece vocabulary, trained once per run and kept in the workdir.

Special ids are fixed so that models can rely on them: `models.tokens` (pad 0, eos 1, bos 2, unk 3).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import sentencepiece as spm

from models.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID


def load_or_train(path: str | Path, texts: Sequence[str], vocab_size: int, seed: int = 0) -> spm.SentencePieceProcessor:
    """Load the model at `path`, or train a unigram model on `texts` and write it there first.

    Reusing the file keeps a resumed run and `eval.py` on the vocabulary the run started with.
    """
    path = Path(path)
    if not path.exists():
        path.write_bytes(train(texts, vocab_size, seed))
    return spm.SentencePieceProcessor(model_file=str(path))


def load(model_proto: bytes) -> spm.SentencePieceProcessor:
    """A vocabulary from its serialized model (the bytes `train` returns, or an spm.model file's)."""
    return spm.SentencePieceProcessor(model_proto=model_proto)


def train(texts: Sequence[str], vocab_size: int, seed: int) -> bytes:
    """A unigram model of `texts`, serialized (nothing is written)."""
    if vocab_size < 8:
        raise ValueError(f"data.vocab_size must be >= 8, got {vocab_size}")
    model = io.BytesIO()
    spm.set_random_generator_seed(seed)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        pad_id=PAD_ID,
        eos_id=EOS_ID,
        bos_id=BOS_ID,
        unk_id=UNK_ID,
        hard_vocab_limit=False,  # a small corpus may not support the requested size
        input_sentence_size=2_000_000,  # a random sample of that many sentences on WMT-sized corpora
        shuffle_input_sentence=True,
        num_threads=1,
        minloglevel=2,
    )
    return model.getvalue()
