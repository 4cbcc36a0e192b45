"""Scaled dot-product attention for ONE head, as the paper writes it: softmax(q kᵀ / √d_k) v.

Every dense implementation (`attention.impl.vmap`, `attention.impl.einsum`) computes exactly
this; the conventions live here once: logits and softmax in float32 (at least), masked logits
set to `finfo.min` (a row with every key masked gets uniform weights: the mean of V, as Flax
and `jax.nn`), and attention dropout drawn as `flax.linen.dot_product_attention_weights` draws it.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def attention_head(q, k, v, mask=None, bias=None, keep=None, *, scores, mix):
    """q `[Lq, d_k]`, k `[Lk, d_k]`, v `[Lk, d_v]`; mask/bias/keep `[Lq|1, Lk|1]` -> (out `[Lq, d_v]`, weights
    `[Lq, Lk]`).

    The two products come bound (precision and spelling chosen by the caller, as
    `attention.formulation.products` binds a formulation's): `scores(q, k)` -> q kᵀ `[Lq, Lk]` in float32
    at least (`attention.formulation.logits_dtype`), `mix(weights, v)` -> weights · v `[Lq, d_v]`.
    `keep` is the dropout multiplier (keep-mask / keep_prob); the weights returned are pre-dropout.
    """
    d_k = q.shape[-1]
    logits = scores(q * jnp.asarray(1 / math.sqrt(d_k), q.dtype), k)
    weights = softmax(logits, mask, bias).astype(v.dtype)
    dropped = weights if keep is None else weights * keep
    return mix(dropped, v), weights


def softmax(logits, mask, bias):
    """Softmax over the last axis of biased logits, masked entries (mask False) at `finfo.min`."""
    if bias is not None:
        logits = logits + bias.astype(logits.dtype)
    if mask is not None:
        logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    return jax.nn.softmax(logits, axis=-1)


def dropout_multiplier(rate, rng, broadcast, logits_shape, dtype):
    """keep-mask / keep_prob over `logits_shape` `[..., Lq, Lk]`, drawn as Flax draws it; None when off.

    Random bits depend only on the flat index, so any reshape of Flax's `[batch..., H, Lq, Lk]`
    (such as `[B, G, H/G, Lq, Lk]`) draws the same mask.
    """
    if rng is None or rate == 0.0:
        return None
    keep_prob = 1.0 - rate
    shape = (1,) * (len(logits_shape) - 2) + tuple(logits_shape[-2:]) if broadcast else logits_shape
    keep = jax.random.bernoulli(rng, keep_prob, shape)
    return keep.astype(dtype) / jnp.asarray(keep_prob, dtype=dtype)
