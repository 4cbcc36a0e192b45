"""Sentences to flat token arrays in worker processes: imports SentencePiece and NumPy alone, so a worker starts in
a fraction of a second (the model packages would bring JAX into every worker)."""

from __future__ import annotations

import numpy as np
import sentencepiece as spm

_vocab: spm.SentencePieceProcessor | None = None


def start(model_proto: bytes) -> None:
    """A worker's initializer: load the vocabulary once."""
    global _vocab
    _vocab = spm.SentencePieceProcessor(model_proto=model_proto)


def encode(sentences: list[str]) -> tuple[bytes, np.ndarray]:
    """`sentences` as (their token ids end to end, int32 bytes; each one's length, int64)."""
    assert _vocab is not None, "start() first"
    ids = _vocab.encode(sentences)
    lengths = np.fromiter(map(len, ids), np.int64, count=len(ids))
    return np.fromiter((t for s in ids for t in s), np.int32, count=int(lengths.sum())).tobytes(), lengths
