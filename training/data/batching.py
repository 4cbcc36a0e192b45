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
the same number of batches, so step s is always batch `s % n` of epoch `s // n`. An epoch's plan is
drawn once and kept while its steps are served, and a batch is gathered from flat token arrays
(`Tokens`, memory-mapped where the data was prepared: training.prepared) with NumPy, so a step
costs O(batch) however large the corpus. A process may gather only the rows its devices hold
(`batch(step, rows=(start, stop))`): the rows of every process together are the global batch.
"""

from __future__ import annotations

import dataclasses
import functools
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


@dataclasses.dataclass(frozen=True)
class Tokens:
    """One side of a tokenized corpus as two flat arrays: sentence i is `tokens[offsets[i]:offsets[i + 1]]`.

    tokens: [total] int32 (a memory map where prepared); offsets: [sentences + 1] int64, offsets[0] = 0.
    """

    tokens: np.ndarray
    offsets: np.ndarray

    @classmethod
    def of(cls, sentences: Sequence[Sequence[int]]) -> Tokens:
        """Token lists (a SentencePiece `encode` result) as flat arrays."""
        lengths = np.fromiter(map(len, sentences), np.int64, count=len(sentences))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        tokens = np.fromiter((t for s in sentences for t in s), np.int32, count=int(offsets[-1]))
        return cls(tokens, offsets)

    @functools.cached_property
    def lengths(self) -> np.ndarray:
        """[sentences] int64, computed once (a batch reads it: at WMT14's size a diff is milliseconds)."""
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]


def _tokens(side) -> Tokens:
    return side if isinstance(side, Tokens) else Tokens.of(side)


class BatchSchedule:
    """The batches of an epoch for a tokenized corpus; `examples_dropped` counts over-long pairs.

    src_ids, tgt_ids: `Tokens`, or token lists. packed_rows: the packing plan (`pack_rows`'s rows as flat example
    ids and row offsets) where one is cached for this (corpus, seed, pack_length), else it is computed here.
    """

    def __init__(
        self,
        src_ids: Tokens | Sequence[Sequence[int]],
        tgt_ids: Tokens | Sequence[Sequence[int]],
        *,
        token_budget: int,
        bucket_lengths: Sequence[int],
        seed: int,
        pack_length: int = 0,
        packed_rows: tuple[np.ndarray, np.ndarray] | None = None,
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
        self.src_ids, self.tgt_ids, self.seed = _tokens(src_ids), _tokens(tgt_ids), seed
        src_len = self.src_ids.lengths
        tgt_len = self.tgt_ids.lengths + 1  # + BOS / EOS
        if len(src_len) != len(tgt_len):
            raise ValueError(f"{len(src_len)} source but {len(tgt_len)} target sequences")
        self.packed_rows = None  # packed: (example ids, row offsets), row r's ids = ids[offsets[r]:offsets[r + 1]]
        if pack_length:
            fits = np.flatnonzero((src_len <= pack_length) & (tgt_len <= pack_length))
            self.examples_dropped = len(src_len) - len(fits)
            if packed_rows is None:
                order = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0,))).permutation(fits)
                packed_rows = flat_rows(pack_rows(order, src_len, tgt_len, pack_length))
            self.packed_rows = packed_rows
            self.buckets = [(pack_length, token_budget // pack_length, np.arange(len(packed_rows[1]) - 1))]
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
        self.rows_of = {length: rows for length, rows, _ in self.buckets}
        self._plan: tuple[int, tuple] | None = None  # (epoch, its plan, `_planned`): the epoch being served

    def epoch(self, epoch: int) -> list[tuple[int, np.ndarray]]:
        """[(bucket length, example indices, or packed row indices)] in the order the batches of `epoch` are served."""
        return [self._planned(epoch, index) for index in range(self.batches_per_epoch)]

    def _planned(self, epoch: int, index: int) -> tuple[int, np.ndarray]:
        """Batch `index` of `epoch`'s plan: (bucket length, its example or packed-row indices).

        An epoch's plan is each bucket's examples permuted and cut into batches, then the batches permuted, all
        drawn from one generator seeded by (seed, epoch); it is drawn once per epoch and kept as the permuted
        arrays, a batch read off them by index arithmetic.
        """
        if self._plan is None or self._plan[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            permuted = [rng.permutation(ids) for _, _, ids in self.buckets]
            batches = [-(-len(ids) // rows) for _, rows, ids in self.buckets]
            self._plan = (epoch, (permuted, np.cumsum(batches), rng.permutation(sum(batches))))
        permuted, ends, order = self._plan[1]
        planned = int(order[index])
        bucket = int(np.searchsorted(ends, planned, side="right"))
        length, rows, _ = self.buckets[bucket]
        first = (planned - (ends[bucket - 1] if bucket else 0)) * rows
        return length, permuted[bucket][first : first + rows]

    def shape(self, step: int) -> tuple[int, int]:
        """(rows, length) of the batch served at `step`."""
        length, _ = self._planned(step // self.batches_per_epoch, step % self.batches_per_epoch)
        return self.rows_of[length], length

    def batch(self, step: int, rows: tuple[int, int] | None = None) -> Batch:
        """The batch served at global `step` (0-based), the same on every run with this seed.

        rows: (start, stop), only those rows of it (a process's share; rows past the batch's are padding).
        """
        length, ids = self._planned(*divmod(step, self.batches_per_epoch))
        start, stop = rows or (0, self.rows_of[length])
        ids = ids[start:stop]
        if self.packed_rows is not None:
            return gather_packed(self.src_ids, self.tgt_ids, self.packed_rows, ids, stop - start, length)
        return gather(self.src_ids, self.tgt_ids, ids, stop - start, length)

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


def flat_rows(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """`pack_rows`'s rows as (example ids [pairs] int64, row offsets [rows + 1] int64)."""
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    return np.fromiter((i for r in rows for i in r), np.int64, count=int(offsets[-1])), offsets


def _spans(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For spans [starts[k], starts[k] + lengths[k]): (the span each element belongs to, its position in it)."""
    owner = np.repeat(np.arange(len(lengths)), lengths)
    first = np.cumsum(lengths) - lengths
    return owner, np.arange(int(lengths.sum())) - first[owner]


def gather(src: Tokens, tgt: Tokens, ids: np.ndarray, rows: int, length: int) -> Batch:
    """Examples `ids` as a bucketed `[rows, length]` Batch (`BatchSchedule.assemble`'s layout), gathered at once."""
    arrays = np.full((3, rows, length), PAD_ID, dtype=np.int32)
    n = len(ids)
    src_len, tgt_len = src.lengths[ids], tgt.lengths[ids]
    row, col = _spans(src.offsets[ids], src_len)
    arrays[0, row, col] = src.tokens[src.offsets[ids][row] + col]
    row, col = _spans(tgt.offsets[ids], tgt_len)
    words = tgt.tokens[tgt.offsets[ids][row] + col]
    arrays[1, row, col + 1] = words  # BOS + target
    arrays[2, row, col] = words  # target + EOS
    arrays[1, np.arange(n), 0] = BOS_ID
    arrays[2, np.arange(n), tgt_len] = EOS_ID
    return Batch(arrays[0], arrays[1], arrays[2], (arrays[2] != PAD_ID).astype(np.float32))


def gather_packed(
    src: Tokens, tgt: Tokens, packed_rows: tuple[np.ndarray, np.ndarray], row_ids: np.ndarray, rows: int, length: int
) -> Batch:
    """Packed rows `row_ids` as a `[rows, length]` Batch (`BatchSchedule.assemble_packed`'s layout), gathered at
    once: pair k (from 1) of a row fills the next slots of each side, segment k, positions from 0."""
    ids, offsets = packed_rows
    per_row = offsets[row_ids + 1] - offsets[row_ids]
    row_of_pair, k = _spans(offsets[row_ids], per_row)
    pairs = ids[offsets[row_ids][row_of_pair] + k]
    arrays = np.full((7, rows, length), PAD_ID, dtype=np.int32)
    out_src, tgt_in, tgt_out, src_seg, tgt_seg, src_pos, tgt_pos = arrays
    for side, lengths, tokens_seg, positions in (
        (src, src.lengths[pairs], src_seg, src_pos),
        (tgt, tgt.lengths[pairs] + 1, tgt_seg, tgt_pos),  # + BOS / EOS
    ):
        # where each pair starts in its row: the lengths of the pairs before it in the same row
        before = np.cumsum(lengths) - lengths
        start = before - before[np.searchsorted(row_of_pair, row_of_pair, side="left")]
        pair, pos = _spans(start, lengths)
        row, col = row_of_pair[pair], start[pair] + pos
        tokens_seg[row, col] = k[pair] + 1
        positions[row, col] = pos
        if side is src:
            out_src[row, col] = src.tokens[src.offsets[pairs][pair] + pos]
        else:
            word = pos < lengths[pair] - 1  # the target's own tokens; the last slot is EOS out, and BOS in at pos 0
            source = tgt.offsets[pairs][pair] + pos
            tgt_out[row[word], col[word]] = tgt.tokens[source[word]]
            tgt_out[row[~word], col[~word]] = EOS_ID
            tgt_in[row[word], col[word] + 1] = tgt.tokens[source[word]]
            tgt_in[row[pos == 0], col[pos == 0]] = BOS_ID
    weights = (tgt_seg != 0).astype(np.float32)
    return Batch(out_src, tgt_in, tgt_out, weights, src_seg, tgt_seg, src_pos, tgt_pos)


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
