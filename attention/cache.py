"""The decode-cache protocol both layers use: write new keys/values, advance the positions, mask causally.

The cache is `[batch..., G, max_length, D]` (the layout attention computes in,
`attention.grouped`), and `index` holds the next free position: one for the whole batch (`[]`,
the Linen layer's, as Flax's) or one per sequence (`[batch...]`, the NNX layer's), so a batch of
prompts of different lengths decodes together. Sequence b's new tokens land at `index[b],
index[b] + 1, ...`; positions past the end are dropped, never clamped onto earlier entries. Its
query at absolute position p sees cached keys <= p, exactly the keys the full causal pass shows it.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax.numpy as jnp

from attention.formulation import Formulation, resolve
from attention.masks import and_masks, as_bool_mask, causal_from

Array = Any


class Step(NamedTuple):
    """What one decode call leaves: the state to store, and what the attention reads."""

    cached_key: Array  # [batch..., G, max_length, d_k], written
    cached_value: Array  # [batch..., G, max_length, d_v], written
    index: Array  # the next free positions, [] or [batch...]
    key: Array  # the whole cache in the caller's layout, [batch..., max_length, G, d_k]
    value: Array  # [batch..., max_length, G, d_v]
    mask: Array  # bool, broadcastable to [batch..., H, L_new, max_length]: the caller's mask and causality
    offset: Array  # the first new query's absolute position (the index before the write), [] or [batch...]


def step(cached_key: Array, cached_value: Array, index: Array, key: Array, value: Array, mask: Array | None, *,
         num_heads: int, lengths: Array | None = None, formulation: Formulation | None = None) -> Step:
    """Append key `[batch..., L_new, G, d_k]` / value `[batch..., L_new, G, d_v]` at `index`.

    mask: the caller's, broadcastable to `[batch..., H, L_new, max_length]`, bool or numeric.
    lengths: the real new tokens per sequence, int `[batch...]` (default L_new; needs a
    per-sequence `index`). `formulation.materialize` sees the written caches (`attention.formulation`).
    """
    *batch, G, max_length, _ = cached_key.shape
    batch, new_length = tuple(batch), key.shape[-3]
    if tuple(key.shape[:-3]) != batch or key.shape[-2] != G or new_length > max_length:
        raise ValueError(f"decode: the cache holds {max_length} positions for batch {batch} and {G} KV heads, "
                         f"got keys {key.shape} (at most {max_length} new positions)")
    advance = _advance(lengths, index, batch, new_length)
    mask = as_bool_mask("mask", mask, (*batch, num_heads, new_length, max_length))
    written = resolve(formulation).materialize((write(cached_key, key, index), write(cached_value, value, index)))
    mask = and_masks(mask, causal_mask(index, new_length, max_length))
    to_caller = lambda x: jnp.swapaxes(x, -3, -2)  # noqa: E731 (attend's grouping undoes it: XLA folds the pair)
    return Step(*written, index + advance, *map(to_caller, written), mask, index)


def _advance(lengths, index, batch, new_length):
    if lengths is None:
        return jnp.asarray(new_length, index.dtype)
    lengths = jnp.asarray(lengths)
    if lengths.shape != batch or not jnp.issubdtype(lengths.dtype, jnp.integer) or index.shape != batch:
        raise ValueError(f"lengths must be ints of shape {batch} (the real new tokens per sequence) over a cache "
                         f"with one position per sequence, got {lengths.dtype} {lengths.shape} (index {index.shape})")
    return lengths.astype(index.dtype)


def write(cache: Array, new: Array, index: Array) -> Array:
    """cache `[batch..., G, L, D]`, new `[batch..., L_new, G, D]`, index `[]` or `[batch...]` -> updated cache.

    Row b gets `new[b]` at positions `index[b] .. index[b] + L_new - 1`; positions past the
    end are dropped (never clamped onto earlier entries, as `dynamic_update_slice` would).
    """
    *batch, G, L, D = cache.shape
    L_new = new.shape[-3]
    if index.ndim == 0:  # one position for all: a slice of the length axis
        positions = index + jnp.arange(L_new, dtype=index.dtype)
        return cache.at[..., positions, :].set(jnp.swapaxes(new, -3, -2).astype(cache.dtype), mode="drop")
    B = math.prod(batch)
    positions = index.reshape(B, 1) + jnp.arange(L_new, dtype=index.dtype)[None, :]  # [B, L_new]
    rows = jnp.arange(B, dtype=index.dtype)[:, None]
    flat = cache.reshape(B, G, L, D)
    # advanced indices on axes 0 and 2 put their [B, L_new] first: values are [B, L_new, G, D]
    flat = flat.at[rows, :, positions].set(new.reshape(B, L_new, G, D).astype(cache.dtype), mode="drop")
    return flat.reshape(cache.shape)


def causal_mask(index: Array, new_length: int, max_length: int) -> Array:
    """`[batch..., 1, L_new, max_length]` bool (`[1, L_new, max_length]` for a scalar index): new query i sees keys <= index + i."""
    return causal_from(index, new_length, max_length)[..., None, :, :]  # the head axis
