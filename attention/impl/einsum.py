"""`impl="einsum"`: `attention_head`'s algebra as one batched einsum pair over all heads.

The logits are laid out `[B, G, Lq, R, Lk]`: the order a dot_general of q `[B, Lq, G, R, d_k]`
produces natively, which keeps XLA from transposing the `Lq x Lk` matrices (results/code_choices.md).
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from attention.head import dropout_multiplier, logits_dtype, softmax
from attention.masks import with_structure


def attention(q, k, v, mask, bias, options):
    """The `attention.core` signature: q `[B, Lq, G, R, d_k]`, k/v `[B, G, Lk, D]`."""
    (B, Lq, G, R, d_k), Lk = q.shape, k.shape[2]
    mask = with_structure(mask, options, Lq, Lk)
    keep = dropout_multiplier(
        options.dropout_rate, options.dropout_rng, options.broadcast_dropout, (B, G, R, Lq, Lk), v.dtype
    )
    to_logits_layout = lambda x: None if x is None else jnp.swapaxes(x, 2, 3)
    q = q * jnp.asarray(1 / math.sqrt(d_k), q.dtype)
    logits = jnp.einsum(
        "bqgrd,bgkd->bgqrk", q, k, precision=options.precision, preferred_element_type=logits_dtype(q.dtype)
    )
    weights = softmax(logits, to_logits_layout(mask), to_logits_layout(bias)).astype(v.dtype)
    dropped = weights if keep is None else weights * to_logits_layout(keep)
    # out [B, G, Lq, R, Dv], then moved: XLA:CPU has no bf16 x bf16 -> f32 dot writing [B, Lq, G, R, Dv]
    out = jnp.einsum(
        "bgqrk,bgkd->bgqrd", dropped, v, precision=options.precision, preferred_element_type=logits_dtype(v.dtype)
    )
    return jnp.moveaxis(out, 1, 2), jnp.swapaxes(weights, 2, 3)
