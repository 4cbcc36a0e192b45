"""Token-budget batches, length-bucketed or packed: deterministic per (seed, epoch), so resumable.

Bucketed (the default): each example goes to the smallest bucket length that fits both sides
(the target with BOS or EOS added). A bucket of length L holds `token_budget // L` rows, so
every batch has one of a few fixed shapes (one compile per bucket); the last batch of a bucket
is topped up with empty rows of weight 0.

Packed (`pack_length` N > 0), as Flax examples/wmt packs: several pairs share a row of N tokens,
pair k of a row on both sides; `src_segments`/`tgt_segments` number them 1, 2, ... (0: padding)
and `src_positions`/`tgt_positions` restart at 0 in each, so the model can keep them apart
(`models.Transformer`'s packing arguments). Rows are packed once per schedule (seeded): each
pair goes to the first of the `OPEN_ROWS` most recently opened rows where both of its sides
fit, else opens a row. Every batch is `[token_budget // N, N]`: one shape, one compile.

Which example (or row) lands in which batch depends only on (seed, epoch), and every epoch has
the same number of batches, so step s is always batch `s % n` of epoch `s // n`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from models.tokens import BOS_ID, EOS_ID, PAD_ID

OPEN_ROWS = (
    16  # rows a packed pair may join (first fit among the latest): fill ~0.94 on Multi30k at N = 64 (results/peer.md)
)
PACKING_FIELDS = ("src_segments", "tgt_segments", "src_positions", "tgt_positions")


@dataclasses.dataclass(frozen=True)
class Batch:
    """src, tgt_in (BOS + target), tgt_out (target + EOS): [rows, L] int32; weights: [rows, L] float32.

    Packed batches also have `PACKING_FIELDS`, [rows, L] int32 each (None when not packed).
    """

    src: np.ndarray
    tgt_in: np.ndarray
    tgt_out: np.ndarray
    weights: np.ndarray
    src_segments: np.ndarray | None = None
    tgt_segments: np.ndarray | None = None
    src_positions: np.ndarray | None = None
    tgt_positions: np.ndarray | None = None

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
        pack_length: int = 0,
    ):
        """pack_length: 0 buckets the pairs by `bucket_lengths`; N > 0 packs them into rows of N tokens."""
        bucket_lengths = tuple(sorted(bucket_lengths))
        if not bucket_lengths or bucket_lengths[0] < 2:
            raise ValueError(f"data.bucket_lengths must be lengths >= 2, got {bucket_lengths}")
        if not isinstance(pack_length, int) or pack_length == 1 or pack_length < 0:
            raise ValueError(f"data.pack_length must be 0 (buckets) or a row length >= 2, got {pack_length!r}")
        longest = pack_length or bucket_lengths[-1]
        if token_budget < longest:
            raise ValueError(
                f"data.token_budget ({token_budget}) must hold one row of the longest "
                f"{'packed row' if pack_length else 'bucket'} ({longest})"
            )
        self.src_ids, self.tgt_ids, self.seed = src_ids, tgt_ids, seed
        src_len = np.array([len(s) for s in src_ids], dtype=np.int64)
        tgt_len = np.array([len(t) + 1 for t in tgt_ids], dtype=np.int64)  # + BOS / EOS
        if len(src_len) != len(tgt_len):
            raise ValueError(f"{len(src_len)} source but {len(tgt_len)} target sequences")
        self.packed_rows = None  # packed: [example ids] per row
        if pack_length:
            fits = np.flatnonzero((src_len <= pack_length) & (tgt_len <= pack_length))
            self.examples_dropped = len(src_len) - len(fits)
            order = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0,))).permutation(fits)
            self.packed_rows = pack_rows(order, src_len, tgt_len, pack_length)
            self.buckets = [(pack_length, token_budget // pack_length, np.arange(len(self.packed_rows)))]
        else:
            bucket_of = np.searchsorted(
                bucket_lengths, np.maximum(src_len, tgt_len)
            )  # == len(bucket_lengths): too long
            self.examples_dropped = int(np.sum(bucket_of == len(bucket_lengths)))
            self.buckets = [
                (length, token_budget // length, np.flatnonzero(bucket_of == i))
                for i, length in enumerate(bucket_lengths)
            ]
        self.batches_per_epoch = sum(-(-len(ids) // rows) for _, rows, ids in self.buckets)
        if self.batches_per_epoch == 0:
            what = "data.pack_length" if pack_length else "the largest bucket; raise data.bucket_lengths"
            raise ValueError(f"no example fits {what}")

    def epoch(self, epoch: int) -> list[tuple[int, np.ndarray]]:
        """[(bucket length, example indices, or packed row indices)] in the order the batches of `epoch` are served."""
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
        if self.packed_rows is not None:
            pairs = [[(self.src_ids[i], self.tgt_ids[i]) for i in self.packed_rows[row]] for row in ids]
            return self.assemble_packed(pairs, rows, length)
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

    @staticmethod
    def assemble_packed(rows_of_pairs: Sequence[Sequence[tuple]], rows: int, length: int) -> Batch:
        """Lay out `[[(src, tgt), ...] per row]` as a packed `[rows, length]` Batch (missing rows: padding).

        Pair k (from 1) of a row fills the next slots of each side, with segment id k and
        positions 0, 1, ... of its own; the rest of the row is padding (segment 0, position 0).
        """
        arrays = np.full((7, rows, length), PAD_ID, dtype=np.int32)
        src, tgt_in, tgt_out, src_seg, tgt_seg, src_pos, tgt_pos = arrays
        for r, pairs in enumerate(rows_of_pairs):
            at_src = at_tgt = 0
            for k, (s, t) in enumerate(pairs, start=1):
                n, m = len(s), len(t) + 1
                src[r, at_src : at_src + n], src_seg[r, at_src : at_src + n] = s, k
                src_pos[r, at_src : at_src + n] = np.arange(n)
                tgt_in[r, at_tgt : at_tgt + m], tgt_out[r, at_tgt : at_tgt + m] = [BOS_ID, *t], [*t, EOS_ID]
                tgt_seg[r, at_tgt : at_tgt + m], tgt_pos[r, at_tgt : at_tgt + m] = k, np.arange(m)
                at_src, at_tgt = at_src + n, at_tgt + m
        weights = (tgt_seg != 0).astype(np.float32)
        return Batch(src, tgt_in, tgt_out, weights, src_seg, tgt_seg, src_pos, tgt_pos)


def pack_rows(order: Sequence[int], src_len: np.ndarray, tgt_len: np.ndarray, length: int) -> list[list[int]]:
    """Example ids `order` packed into rows of `length` slots a side: [[ids of row 0], ...].

    Each example joins the first of the `OPEN_ROWS` most recently opened rows with room for
    both of its sides (`src_len`, `tgt_len` slots), else opens a row; every length must be <= `length`.
    """
    rows, free, open_rows = [], [], []  # free[r] = [source slots, target slots] left in row r
    for i in order:
        need_src, need_tgt = src_len[i], tgt_len[i]
        r = next((r for r in open_rows if free[r][0] >= need_src and free[r][1] >= need_tgt), None)
        if r is None:
            r = len(rows)
            rows.append([])
            free.append([length, length])
            open_rows.append(r)
            if len(open_rows) > OPEN_ROWS:
                open_rows.pop(0)
        rows[r].append(int(i))
        free[r][0] -= need_src
        free[r][1] -= need_tgt
    return rows


def as_arrays(batch: Batch) -> dict:
    """The dict of [rows, L] arrays the step functions take (with `PACKING_FIELDS` when packed)."""
    arrays = {"src": batch.src, "tgt_in": batch.tgt_in, "tgt_out": batch.tgt_out, "weights": batch.weights}
    return arrays | {name: getattr(batch, name) for name in PACKING_FIELDS if getattr(batch, name) is not None}


def dev_batches(config, vocab, corpus) -> list[dict]:
    """A dev corpus in fixed-shape bucketed batches (every pair once, none dropped; over-long ones cut to max_len).

    The batches' lengths are `config.eval.lengths` where set (a few fixed lengths: one compiled
    eval program each, whatever the buckets), else `config.data.bucket_lengths`.
    """
    limit = config.model.max_len
    lengths = eval_lengths(config) or config.data.bucket_lengths
    src = [ids[:limit] for ids in vocab.encode(list(corpus.src))]
    tgt = [ids[: limit - 1] for ids in vocab.encode(list(corpus.tgt))]  # + BOS / EOS
    by_bucket: dict[int, list[int]] = {}
    for i, (s, t) in enumerate(zip(src, tgt)):
        by_bucket.setdefault(bucket_length(max(len(s), len(t) + 1), lengths), []).append(i)
    batches = []
    for length, ids in sorted(by_bucket.items()):
        rows = max(1, config.data.token_budget // length)
        for k in range(0, len(ids), rows):
            chunk = ids[k : k + rows]
            batches.append(
                as_arrays(BatchSchedule.assemble([src[i] for i in chunk], [tgt[i] for i in chunk], rows, length))
            )
    return batches


def eval_lengths(config) -> tuple[int, ...]:
    """`config.eval.lengths`, the fixed lengths evaluation pads to; () where unset (evaluation then uses the
    buckets)."""
    return tuple(getattr(getattr(config, "eval", None), "lengths", ()) or ())
