"""Beam search's self-attention over a decode cache that is never reordered.

Beam k's position p sits in the cache row of the beam that fed that token, `beam_rows[b, k, p]`, a
table beam search keeps and reorders in place of every layer's keys and values (results/peer.md,
section 6, and bench/decode_ablation.py measure both). `history_attention` reads a source's rows
once, in place, masking the positions off each beam's history; it equals `attention.attend` over
`gather_history`'s keys and values up to the order of float sums. `gather_history` copies each
beam's history out, for the attentions `history_attention` does not serve.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from attention.head import Formulation, logits_dtype, resolve


def check_rows(beam_rows: jax.Array, batch: tuple, max_length: int) -> None:
    """ValueError unless `beam_rows` is `[sources, beams, max_length]`, sources * beams the cache's one batch axis."""
    batch = tuple(batch)
    if (
        beam_rows.ndim != 3
        or len(batch) != 1
        or beam_rows.shape[0] * beam_rows.shape[1] != batch[0]
        or beam_rows.shape[2] != max_length
    ):
        raise ValueError(
            f"cache beam_rows must be [sources, beams, {max_length}] int with sources * beams = the "
            f"batch {batch}, got shape {beam_rows.shape}"
        )


def gather_history(x: jax.Array, beam_rows: jax.Array) -> jax.Array:
    """x `[B*K, G, L, D]` (a cache, heads first), beam_rows `[B, K, L]` -> each beam's own `[B*K, G, L, D]`."""
    B, K, L = beam_rows.shape
    by_source = x.reshape(B, K, *x.shape[1:])
    return jnp.take_along_axis(by_source, beam_rows[:, :, None, :, None], axis=1).reshape(x.shape)


def history_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    beam_rows: jax.Array,
    mask: jax.Array,
    dtype: Any = None,
    precision: Any = None,
    bias: jax.Array | None = None,
    formulation: Formulation | None = None,
) -> jax.Array:
    """Each beam's queries attend its own history in the shared cache.

    query `[B*K, Lq, H, Dk]`; key `[B*K, G, L, Dk]`, value `[B*K, G, L, Dv]` (the cache, heads
    first); beam_rows `[B, K, L]` int; mask broadcastable to `[B*K, H, Lq, L]` bool (the cache
    positions filled so far, and the caller's mask); bias, if given, broadcastable to the same
    shape, float, added to the logits (a position's offset, as span's log soft mask: it depends
    on the position in the hypothesis, which is the same in every row). The query block is broadcast
    over the rows by `formulation.broadcast_queries` (`attention.head`). Returns `[B*K, Lq, H, Dv]` in `dtype`.
    """
    B, K, L = beam_rows.shape
    _, Lq, H, Dk = query.shape
    G, Dv = key.shape[-3], value.shape[-1]
    R = H // G
    dtype = dtype or jnp.result_type(query, key, value)
    query, key, value = (x.astype(dtype) for x in (query, key, value))
    # sources x their K rows (j) x KV heads: the batch axes of both products, major in the cache's
    # `[B*K, G, L, D]`, so neither product copies the cache; M = K Lq R queries of a source and head
    queries = (query * jnp.asarray(1 / math.sqrt(Dk), dtype)).reshape(B, K, Lq, G, R, Dk)
    queries = resolve(formulation).broadcast_queries(
        queries.transpose(0, 3, 1, 2, 4, 5).reshape(B, 1, G, K * Lq * R, Dk), (B, K, G, K * Lq * R, Dk)
    )
    keys, values = (x.reshape(B, K, G, L, x.shape[-1]) for x in (key, value))
    logits = jnp.einsum(
        "bjgmd,bjgpd->bjgmp", queries, keys, precision=precision, preferred_element_type=logits_dtype(dtype)
    )
    if bias is not None:
        logits = logits + _by_source(bias, B, K, G, H, Lq).reshape(B, 1, G, K * Lq * R, L).astype(logits.dtype)
    weights = jax.nn.softmax(
        jnp.where(_history_mask(beam_rows, mask, G, H, Lq), logits, jnp.finfo(logits.dtype).min), axis=(1, 4)
    ).astype(dtype)
    out = jnp.einsum(
        "bjgmp,bjgpd->bjgmd", weights, values, precision=precision, preferred_element_type=logits_dtype(dtype)
    ).sum(axis=1)  # j summed apart: no V transpose
    return out.reshape(B, G, K, Lq, R, Dv).transpose(0, 2, 3, 1, 4, 5).reshape(B * K, Lq, H, Dv).astype(dtype)


def _by_source(x, B, K, G, H, Lq):
    """x broadcastable to `[B*K, H, Lq, L]` -> `[B, 1, G, K, Lq R, L]`: the queries' order in `history_attention`."""
    L = x.shape[-1]
    x = jnp.broadcast_to(x, (B * K, H, Lq, L)).reshape(B, K, G, H // G, Lq, L)
    return x.transpose(0, 2, 1, 4, 3, 5).reshape(B, 1, G, K, Lq * (H // G), L)


def _history_mask(beam_rows, mask, G, H, Lq):
    """`[B, K (row j), G, K Lq R, L]`: beam k's query sees row j's position p if on k's history and `mask` allows."""
    B, K, L = beam_rows.shape
    on_history = beam_rows[:, None, None, :, None, :] == jnp.arange(K)[None, :, None, None, None, None]
    return (_by_source(mask, B, K, G, H, Lq) & on_history).reshape(B, K, G, K * Lq * (H // G), L)
