"""The decode-cache protocol both layers use: write new keys/values, advance the positions, mask causally.

The cache is `[batch..., G, max_length, D]` (the layout attention computes in,
`attention.grouped`), and `index` holds the next free position: one for the whole batch (`[]`,
the Linen layer's, as Flax's) or one per sequence (`[batch...]`, the NNX layer's), so a batch of
prompts of different lengths decodes together. Sequence b's new tokens land at `index[b],
index[b] + 1, ...`; positions outside the cache are dropped, never clamped onto other entries. Its
query at absolute position p sees cached keys <= p, exactly the keys the full causal pass shows it.
A shared index writes with `dynamic_update_slice` (in place under donation, as Flax's cache), a
per-sequence one with a scatter; both follow that one rule (tests/attention/test_cache.py).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from attention.formulation import Formulation, resolve
from attention.masks import and_masks, as_bool_mask, causal_from


class Step(NamedTuple):
    """What one decode call leaves: the state to store, and what the attention reads."""

    cached_key: jax.Array  # [batch..., G, max_length, d_k], written
    cached_value: jax.Array  # [batch..., G, max_length, d_v], written
    next_index: jax.Array  # the next free positions, [] or [batch...]: index advanced by the new tokens
    key: jax.Array  # the whole cache in the caller's layout, [batch..., max_length, G, d_k]
    value: jax.Array  # [batch..., max_length, G, d_v]
    mask: jax.Array  # bool, broadcastable to [batch..., H, L_new, max_length]: the caller's mask and causality
    offset: jax.Array  # the first new query's absolute position (the index before the write), [] or [batch...]


def step(
    cached_key: jax.Array,
    cached_value: jax.Array,
    index: jax.Array,
    key: jax.Array,
    value: jax.Array,
    mask: jax.Array | None,
    *,
    num_heads: int,
    lengths: jax.Array | None = None,
    formulation: Formulation | None = None,
) -> Step:
    """Append key `[batch..., L_new, G, d_k]` / value `[batch..., L_new, G, d_v]` at `index`.

    mask: the caller's, broadcastable to `[batch..., H, L_new, max_length]`, bool or numeric.
    lengths: the real new tokens per sequence, int `[batch...]` (default L_new; needs a
    per-sequence `index`). `formulation.materialize` sees the written caches (`attention.formulation`).
    """
    *lead, G, max_length, _ = cached_key.shape
    batch, new_length = tuple(lead), key.shape[-3]
    if tuple(key.shape[:-3]) != batch or key.shape[-2] != G or new_length > max_length:
        raise ValueError(
            f"decode: the cache holds {max_length} positions for batch {batch} and {G} KV heads, "
            f"got keys {key.shape} (at most {max_length} new positions)"
        )
    advance = _advance(lengths, index, batch, new_length)
    mask = as_bool_mask("mask", mask, (*batch, num_heads, new_length, max_length))
    new_key, new_value = resolve(formulation).materialize(
        (write(cached_key, key, index), write(cached_value, value, index))
    )
    mask = and_masks(causal_mask(index, new_length, max_length), mask)
    to_caller = lambda x: jnp.swapaxes(x, -3, -2)  # attend's grouping undoes it: XLA folds the pair
    return Step(new_key, new_value, index + advance, to_caller(new_key), to_caller(new_value), mask, index)


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
    new = jnp.swapaxes(new, -3, -2)  # [batch..., G, L_new, D], the cache's layout
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
    """`[batch..., 1, L_new, max_length]` bool (`[1, L_new, max_length]` for a scalar index): new query i sees keys <= index + i."""
    return causal_from(index, new_length, max_length)[..., None, :, :]  # the head axis
