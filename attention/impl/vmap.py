"""`impl="vmap"`: `attention_head` mapped over the query heads of a group, the groups, the batch.

At the innermost level K/V are mapped with `in_axes=None`: the R query heads of a group share
their KV head, so GQA/MQA never materialise repeated K/V.
"""

from __future__ import annotations

import functools

import jax

from attention.formulation import products
from attention.grouped import with_structure
from attention.head import attention_head, dropout_multiplier


def attention(q, k, v, mask, bias, options):
    """The `attention.grouped` signature: q `[B, Lq, G, R, d_k]`, k/v `[B, G, Lk, D]`."""
    (B, Lq, G, R, _), Lk = q.shape, k.shape[2]
    mask = with_structure(mask, options, Lq, Lk)
    keep = dropout_multiplier(
        options.dropout_rate, options.dropout_rng, options.broadcast_dropout, (B, G, R, Lq, Lk), v.dtype
    )
    extras = (mask, bias, keep)
    # per mapped level (batch, group, head in group): map a real axis, broadcast a size-1 one
    level_axes = [tuple(None if x is None or x.shape[level] == 1 else 0 for x in extras) for level in range(3)]
    scores, mix = products(options.formulation, options.precision)
    fn = functools.partial(attention_head, scores=scores, mix=mix)
    fn = jax.vmap(fn, in_axes=(1, None, None, *level_axes[2]), out_axes=(1, 0))
    fn = jax.vmap(fn, in_axes=(1, 0, 0, *level_axes[1]), out_axes=(1, 0))
    fn = jax.vmap(fn, in_axes=(0, 0, 0, *level_axes[0]), out_axes=(0, 0))
    return fn(q, k, v, *(_drop_broadcast_axes(x) for x in extras))


def _drop_broadcast_axes(x):
    """Remove the size-1 axes among the three mapped leading axes (they are not mapped)."""
    if x is None:
        return None
    return x.reshape(*(s for s in x.shape[:3] if s != 1), *x.shape[3:])
