"""Token-budget batches with length bucketing: deterministic per (seed, epoch), so resumable.

Each example goes to the smallest bucket length that fits both sides (the target with BOS or
EOS added). A bucket of length L holds `token_budget // L` rows, so every batch has one of a
few fixed shapes (one compile per bucket); the last batch of a bucket is topped up with empty
rows of weight 0. Which example lands in which batch depends only on (seed, epoch), and every
epoch has the same number of batches, so step s is always batch `s % n` of epoch `s // n`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from models.tokens import BOS_ID, EOS_ID, PAD_ID


@dataclasses.dataclass(frozen=True)
class Batch:
    """src, tgt_in (BOS + target), tgt_out (target + EOS): [rows, L] int32; weights: [rows, L] float32."""

    src: np.ndarray
    tgt_in: np.ndarray
    tgt_out: np.ndarray
    weights: np.ndarray

    @property
    def padding_fraction(self) -> float:
        """Share of source and target slots that hold padding."""
        real = np.count_nonzero(self.src != PAD_ID) + np.count_nonzero(self.weights)
        return 1.0 - real / (self.src.size + self.tgt_out.size)


def bucket_length(length: int, bucket_lengths: Sequence[int]) -> int:
    """The smallest bucket length >= `length`, or `length` itself when it exceeds every bucket."""
    return next((b for b in sorted(bucket_lengths) if b >= length), length)


class BatchSchedule:
    """The batches of an epoch for a tokenized corpus; `examples_dropped` counts over-long pairs."""

    def __init__(
        self,
        src_ids: Sequence[Sequence[int]],
        tgt_ids: Sequence[Sequence[int]],
        *,
        token_budget: int,
        bucket_lengths: Sequence[int],
        seed: int,
    ):
        bucket_lengths = tuple(sorted(bucket_lengths))
        if not bucket_lengths or bucket_lengths[0] < 2:
            raise ValueError(f"data.bucket_lengths must be lengths >= 2, got {bucket_lengths}")
        if token_budget < bucket_lengths[-1]:
            raise ValueError(
                f"data.token_budget ({token_budget}) must hold one row of the longest bucket "
                f"({bucket_lengths[-1]})"
            )
        self.src_ids, self.tgt_ids, self.seed = src_ids, tgt_ids, seed
        needed = np.array([max(len(s), len(t) + 1) for s, t in zip(src_ids, tgt_ids, strict=True)])
        bucket_of = np.searchsorted(bucket_lengths, needed)  # == len(bucket_lengths): too long
        self.examples_dropped = int(np.sum(bucket_of == len(bucket_lengths)))
        self.buckets = [
            (length, token_budget // length, np.flatnonzero(bucket_of == i))
            for i, length in enumerate(bucket_lengths)
        ]
        self.batches_per_epoch = sum(-(-len(ids) // rows) for _, rows, ids in self.buckets)
        if self.batches_per_epoch == 0:
            raise ValueError("no example fits the largest bucket; raise data.bucket_lengths")

    def epoch(self, epoch: int) -> list[tuple[int, np.ndarray]]:
        """[(bucket length, example indices)] in the order the batches of `epoch` are served."""
        rng = np.random.default_rng([self.seed, epoch])
        plan = []
        for length, rows, ids in self.buckets:
            ids = rng.permutation(ids)
            plan += [(length, ids[i : i + rows]) for i in range(0, len(ids), rows)]
        order = rng.permutation(len(plan))
        return [plan[i] for i in order]

    def batch(self, step: int) -> Batch:
        """The batch served at global `step` (0-based), the same on every run with this seed."""
        epoch, index = divmod(step, self.batches_per_epoch)
        length, ids = self.epoch(epoch)[index]
        rows = next(r for l, r, _ in self.buckets if l == length)
        return self.assemble([self.src_ids[i] for i in ids], [self.tgt_ids[i] for i in ids], rows, length)

    @staticmethod
    def assemble(src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]], rows: int, length: int) -> Batch:
        """Pad a list of pairs into a `[rows, length]` Batch (missing rows are all padding)."""
        arrays = np.full((3, rows, length), PAD_ID, dtype=np.int32)
        for r, (s, t) in enumerate(zip(src, tgt, strict=True)):
            arrays[0, r, : len(s)] = s
            arrays[1, r, : len(t) + 1] = [BOS_ID, *t]
            arrays[2, r, : len(t) + 1] = [*t, EOS_ID]
        return Batch(arrays[0], arrays[1], arrays[2], (arrays[2] != PAD_ID).astype(np.float32))


def as_arrays(batch: Batch) -> dict:
    """The dict of [rows, L] arrays the step functions take."""
    return {"src": batch.src, "tgt_in": batch.tgt_in, "tgt_out": batch.tgt_out, "weights": batch.weights}


def dev_batches(config, vocab, corpus) -> list[dict]:
    """A dev corpus in fixed-shape bucketed batches (every pair once, none dropped; over-long ones cut to max_len)."""
    limit = config.model.max_len
    src = [ids[:limit] for ids in vocab.encode(list(corpus.src))]
    tgt = [ids[: limit - 1] for ids in vocab.encode(list(corpus.tgt))]  # + BOS / EOS
    by_bucket: dict[int, list[int]] = {}
    for i, (s, t) in enumerate(zip(src, tgt)):
        by_bucket.setdefault(bucket_length(max(len(s), len(t) + 1), config.data.bucket_lengths), []).append(i)
    batches = []
    for length, ids in sorted(by_bucket.items()):
        rows = max(1, config.data.token_budget // length)
        for k in range(0, len(ids), rows):
            chunk = ids[k : k + rows]
            batches.append(as_arrays(BatchSchedule.assemble([src[i] for i in chunk], [tgt[i] for i in chunk], rows, length)))
    return batches
