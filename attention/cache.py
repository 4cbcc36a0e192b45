"""The decode cache: `KVCache`, the one typed state both faces decode through.

It holds the keys and values heads first, `[batch..., G, max_length, D]` (`LAYOUT`), the layout
attention reads them in, and the write `index`: one position for the batch or one a sequence. A
decode step (`KVCache.step`) writes the new keys and values and returns what attention reads
(`CacheRead`); a query at position p sees the cached keys <= p, as in the full causal pass.
docs/attention.md ("The decode cache") tells the rules and why the layout was chosen.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct
from jax import lax

from attention import beams
from attention.core import relayout
from attention.geometry import is_positive_int, require
from attention.head import Formulation, resolve
from attention.masks import and_masks, as_bool_mask, causal_from

# the Flax variables a KVCache is stored in, by field (Flax's names; the table is beam search's)
_NAMES = {"key": "cached_key", "value": "cached_value", "index": "cache_index", "beam_rows": "beam_rows"}
VARIABLES = tuple(_NAMES[name] for name in ("key", "value", "index"))  # what a layer without beam search stores
BEAM_ROWS = _NAMES["beam_rows"]  # beam search's table, handed to a layer in its decode state
LAYOUT = "BNTH"  # keys/values `[batch..., G, max_length, D]` (`attention.core.KV_LAYOUTS`)


@struct.dataclass
class _TableReadInPlace:
    """A beam table as a layer that read its cache through it stores it back: its cache was never reordered."""

    rows: jax.Array


class CacheRead(NamedTuple):
    """What attention reads after a decode step."""

    key: jax.Array  # [batch..., G, max_length, d_k]: the cache, in its `LAYOUT` (each beam's own history,
    value: jax.Array  # [batch..., G, max_length, d_v]   unless read in place)
    mask: jax.Array  # bool, broadcastable to [batch..., H, L_new, max_length]: the caller's mask and causality
    offset: jax.Array  # the first new query's absolute position (the index before the write), [] or [batch...]
    beam_rows: jax.Array | None  # [sources, beams, max_length] when key/value are to be read in place, else None


@struct.dataclass
class KVCache:
    """A layer's decode cache: keys, values, the write index and beam search's table."""

    key: jax.Array  # [batch..., G, max_length, d_k]
    value: jax.Array  # [batch..., G, max_length, d_v]
    index: jax.Array  # int32, the next free position: [] (one for the batch) or [batch...] (one per sequence)
    beam_rows: jax.Array | None = None  # [sources, beams, max_length] int: the row holding each beam's position
    reads_beam_rows: bool = struct.field(pytree_node=False, default=False)  # a step read it through the table

    @classmethod
    def empty(
        cls,
        batch: tuple,
        max_length: int,
        num_kv_heads: int,
        head_dim: int,
        v_head_dim: int,
        dtype: Any,
        *,
        per_sequence: bool = True,
    ) -> KVCache:
        """Zeros for `batch` sequences of `max_length`; index `[batch...]`, or `[]` (Flax's) unless `per_sequence`."""
        shape = (*batch, num_kv_heads, max_length)
        return cls(
            jnp.zeros((*shape, head_dim), dtype),
            jnp.zeros((*shape, v_head_dim), dtype),
            jnp.zeros(batch if per_sequence else (), jnp.int32),
        )

    @classmethod
    def load(cls, variables: Mapping[str, Any]) -> KVCache | None:
        """The cache `store` left in `variables` (a layer's `cache` collection, or its attributes' values), or None."""
        if variables.get(_NAMES["key"]) is None:
            return None
        table = variables.get(_NAMES["beam_rows"])
        return cls(
            key=variables[_NAMES["key"]],
            value=variables[_NAMES["value"]],
            index=variables[_NAMES["index"]],
            beam_rows=table.rows if isinstance(table, _TableReadInPlace) else table,
            reads_beam_rows=isinstance(table, _TableReadInPlace),
        )

    def store(self) -> dict[str, Any]:
        """`{variable name: value}`: the arrays under Flax's names, and the table if there is one."""
        stored: dict[str, Any] = {_NAMES[name]: getattr(self, name) for name in ("key", "value", "index")}
        if self.beam_rows is not None:
            stored[_NAMES["beam_rows"]] = _TableReadInPlace(self.beam_rows) if self.reads_beam_rows else self.beam_rows
        return stored

    @classmethod
    def typed(cls, tree: Any) -> Any:
        """A `cache` collection with every layer's stored cache (a mapping holding `cached_key`) as a `KVCache`."""
        if not isinstance(tree, Mapping):
            return tree
        if _NAMES["key"] in tree:
            others = {name: x for name, x in tree.items() if name not in _NAMES.values()}
            return {**others, _NAMES["key"]: cls.load(tree)}  # `untyped` stores it back under its names
        return {name: cls.typed(x) for name, x in tree.items()}

    @classmethod
    def untyped(cls, tree: Any) -> Any:
        """`typed`'s inverse: every `KVCache` back into its variables."""
        if isinstance(tree, KVCache):
            return tree.store()
        if not isinstance(tree, Mapping):
            return tree
        out: dict[str, Any] = {}
        for name, x in tree.items():
            out.update(x.store() if isinstance(x, KVCache) else {name: cls.untyped(x)})
        return out

    @property
    def batch(self) -> tuple:
        return tuple(self.key.shape[:-3])

    @property
    def num_kv_heads(self) -> int:
        return self.key.shape[-3]

    @property
    def max_length(self) -> int:
        return self.key.shape[-2]

    def with_beam_rows(self, rows: jax.Array) -> KVCache:
        """This cache with beam search's table, rows `[sources, beams, T]` cut to its `max_length` positions."""
        return dataclasses.replace(self, beam_rows=rows[:, :, : self.max_length], reads_beam_rows=False)

    def reorder(self, parents: jax.Array | None) -> KVCache:
        """Beam search's next step: beam k of source b continues beam `parents[b, k]` (`[sources, beams]` int; None:
        keep the order). A cache read through its table stays in place (its rows are each beam's own, the table
        says where each history lies); one that was not (Flax's own layer) has its rows reordered. The table is
        dropped: beam search hands in a new one each step.
        """
        cache = dataclasses.replace(self, beam_rows=None, reads_beam_rows=False)
        if parents is None or self.reads_beam_rows:
            return cache
        return dataclasses.replace(
            cache, key=_reorder_rows(self.key, parents), value=_reorder_rows(self.value, parents)
        )

    def write(self, key: jax.Array, value: jax.Array) -> KVCache:
        """key `[batch..., L_new, G, d_k]` and value `[batch..., L_new, G, d_v]` written at `index` (not advanced)."""
        return dataclasses.replace(
            self, key=write(self.key, key, self.index), value=write(self.value, value, self.index)
        )

    def step(
        self,
        key: jax.Array,
        value: jax.Array,
        mask: jax.Array | None,
        *,
        num_heads: int,
        lengths: jax.Array | None = None,
        formulation: Formulation | None = None,
        beams_in_place: bool = False,
    ) -> tuple[KVCache, CacheRead]:
        """Append key `[batch..., L_new, G, d_k]` / value `[batch..., L_new, G, d_v]` at `index`.

        mask: the caller's, broadcastable to `[batch..., H, L_new, max_length]`, bool or numeric.
        lengths: the real new tokens per sequence, int `[batch...]` (default L_new; needs a
        per-sequence `index`). The write is `formulation.write_cache` (`attention.head`).
        Under beam search (a `beam_rows` table) the cache rows hold the beams' histories spread
        out: read in place (`CacheRead.beam_rows`) if `beams_in_place`, else gathered into each beam's
        own keys/values. -> (the cache to store, what attention reads).
        """
        batch, max_length, G, new_length = self.batch, self.max_length, self.num_kv_heads, key.shape[-3]
        if tuple(key.shape[:-3]) != batch or key.shape[-2] != G or new_length > max_length:
            raise ValueError(
                f"decode: the cache holds {max_length} positions for batch {batch} and {G} KV heads, "
                f"got keys {key.shape} (at most {max_length} new positions)"
            )
        advance = _advance(lengths, self.index, batch, new_length)
        mask = as_bool_mask("mask", mask, (*batch, num_heads, new_length, max_length))
        written = resolve(formulation).write_cache(self, key, value)
        mask = and_masks(causal_mask(self.index, new_length, max_length), mask)
        new = dataclasses.replace(written, index=self.index + advance, reads_beam_rows=self.beam_rows is not None)
        read = CacheRead(new.key, new.value, mask, self.index, None)
        if self.beam_rows is None:
            return new, read
        beams.check_rows(self.beam_rows, batch, max_length)
        if beams_in_place:
            return new, read._replace(beam_rows=self.beam_rows)
        gather = lambda x: beams.gather_history(x, self.beam_rows)
        return new, read._replace(key=gather(read.key), value=gather(read.value))


def _reorder_rows(x, parents):
    """x `[sources * beams, ...]` -> row k of source b from row `parents[b, k]`."""
    B, K = parents.shape
    by_source = x.reshape(B, K, *x.shape[1:])
    return jax.vmap(lambda rows, idx: rows[idx])(by_source, parents).reshape(x.shape)


def _advance(lengths, index, batch, new_length):
    if lengths is None:
        return jnp.asarray(new_length, index.dtype)
    lengths = jnp.asarray(lengths)
    if lengths.shape != batch or not jnp.issubdtype(lengths.dtype, jnp.integer) or index.shape != batch:
        raise ValueError(
            f"lengths must be ints of shape {batch} (the real new tokens per sequence) over a cache "
            f"with one position per sequence, got {lengths.dtype} {lengths.shape} (index {index.shape})"
        )
    return lengths.astype(index.dtype)


def write(cache: jax.Array, new: jax.Array, index: jax.Array) -> jax.Array:
    """cache `[batch..., G, L, D]`, new `[batch..., L_new, G, D]`, index `[]` or `[batch...]` -> updated cache.

    Row b gets `new[b]` at positions `index[b] .. index[b] + L_new - 1`; positions outside
    `[0, L)` are dropped (never clamped onto other entries, as `dynamic_update_slice` would).
    """
    new = new.astype(cache.dtype)
    return (_write_shared if index.ndim == 0 else _write_per_sequence)(cache, new, index)


def _write_shared(cache, new, index):
    """One position for the whole batch: a `dynamic_update_slice` of the length axis, in place under donation.

    The block lands where `dynamic_update_slice` puts it anyway, `start` (the index clipped into the
    cache); where that is not the index (the block would overhang an end), the new entries shift
    by the difference and the slots no new position reaches keep their old entries.
    """
    new = relayout(new, "BTNH", LAYOUT)  # [batch..., G, L_new, D]
    L, L_new = cache.shape[-2], new.shape[-2]
    start = jnp.clip(index, 0, L - L_new)
    shift = index - start  # 0 unless the block overhangs an end
    if L_new > 1:  # (one new position: shift 0 writes it, any other drops it)
        new = jnp.roll(new, shift, axis=-2)
    slot = lax.broadcasted_iota(index.dtype, new.shape, new.ndim - 2)  # each entry's place in the block
    old = lax.dynamic_slice_in_dim(cache, start, L_new, axis=-2)
    block = jnp.where((slot >= shift) & (slot < shift + L_new), new, old)
    return lax.dynamic_update_slice_in_dim(cache, block, start, axis=-2)


def _write_per_sequence(cache, new, index):
    """One position per sequence: a scatter of each row's new entries (out-of-range positions dropped)."""
    *batch, G, L, D = cache.shape
    B, L_new = math.prod(batch), new.shape[-3]
    positions = index.reshape(B, 1) + jnp.arange(L_new, dtype=index.dtype)[None, :]  # [B, L_new]
    positions = jnp.where(positions < 0, L, positions)  # dropped too, not counted from the end
    rows = jnp.arange(B, dtype=index.dtype)[:, None]
    # advanced indices on axes 0 and 2 put their [B, L_new] first: values are [B, L_new, G, D]
    flat = cache.reshape(B, G, L, D).at[rows, :, positions].set(new.reshape(B, L_new, G, D), mode="drop")
    return flat.reshape(cache.shape)


def causal_mask(index: jax.Array, new_length: int, max_length: int) -> jax.Array:
    """`[batch..., 1, L_new, max_length]` bool (`[1, L_new, max_length]` for a scalar index).

    New query i sees keys <= index + i.
    """
    return causal_from(index, new_length, max_length)[..., None, :, :]  # the head axis


# --- a cross-attention's kept source ---------------------------------------------------------------

CROSS_KV = ("cross_key", "cross_value")  # the names of a cross-attention's stored source keys/values


def cross_kv(stored: tuple | None, project_kv: Callable, store: Callable | None) -> tuple:
    """A cross-attention's (key, value) `[batch..., G, Ls, D]` (`LAYOUT`): `stored`, else `project_kv()`'s.

    The projections (`[batch..., Ls, G, D]`) are put in the cache's layout here, once, and
    `store(name, x)`-ed so: later steps read the source as attention computes in, untransposed.
    """
    if stored is not None:
        return stored
    key, value = (relayout(x, "BTNH", LAYOUT) for x in project_kv())
    if store is not None:
        for name, x in zip(CROSS_KV, (key, value)):
            store(name, x)
    return key, value


def check_cache_size(batch: tuple, max_length: int) -> None:
    """A ValueError unless a cache's batch sizes and max_length are positive ints."""
    require(
        "the cache's ",
        "batch and max_length",
        (*batch, max_length),
        all(map(is_positive_int, (*batch, max_length))),
        "positive ints",
    )
