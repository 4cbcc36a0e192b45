"""A decode cache with one position per sequence: write new keys/values, and the causal mask over it.

The cache is `[batch..., G, max_length, D]` (the layout attention computes in,
`attention.grouped`), and `index [batch...]` holds each sequence's next free position, so
a batch of prompts of different lengths decodes together: sequence b's new tokens land at
`index[b], index[b] + 1, ...` and its query at absolute position p sees cached keys <= p,
exactly the keys the full causal pass shows it.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp

Array = Any


def write(cache: Array, new: Array, index: Array) -> Array:
    """cache `[batch..., G, L, D]`, new `[batch..., L_new, G, D]`, index `[batch...]` -> updated cache.

    Row b gets `new[b]` at positions `index[b] .. index[b] + L_new - 1`; positions past the
    end are dropped (never clamped onto earlier entries, as `dynamic_update_slice` would).
    """
    *batch, G, L, D = cache.shape
    B, L_new = math.prod(batch), new.shape[-3]
    positions = index.reshape(B, 1) + jnp.arange(L_new, dtype=index.dtype)[None, :]  # [B, L_new]
    rows = jnp.arange(B, dtype=index.dtype)[:, None]
    flat = cache.reshape(B, G, L, D)
    # advanced indices on axes 0 and 2 put their [B, L_new] first: values are [B, L_new, G, D]
    flat = flat.at[rows, :, positions].set(new.reshape(B, L_new, G, D).astype(cache.dtype), mode="drop")
    return flat.reshape(cache.shape)


def causal_mask(index: Array, new_length: int, max_length: int) -> Array:
    """`[batch..., 1, L_new, max_length]` bool: new query i of sequence b sees keys <= index[b] + i."""
    steps = jnp.arange(new_length, dtype=index.dtype).reshape((1,) * index.ndim + (new_length,))
    query_positions = index[..., None] + steps  # [batch..., L_new]
    keys = jnp.arange(max_length, dtype=index.dtype).reshape((1,) * (index.ndim + 1) + (max_length,))
    mask = keys <= query_positions[..., None]
    return mask[..., None, :, :]
