"""Scaled dot-product attention for ONE head, as the paper writes it: softmax(q kᵀ / √d_k) v.

Every dense implementation (`attention.impl.vmap`, `attention.impl.einsum`) computes exactly
this; the conventions live here once: logits and softmax in float32 (at least), masked logits
set to `finfo.min` (a row with every key masked gets uniform weights: the mean of V, as Flax
and `jax.nn`), and attention dropout drawn as `flax.linen.dot_product_attention_weights` draws it.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

Array = Any
# A few queries against many keys (a decode step against its cache): logits as (K Qᵀ)ᵀ, so
# XLA:CPU streams K instead of repacking it (bench/decode.py, results/decode_bench.md).
FEW_QUERIES_PER_KEY = 1 / 8


def attention_head(q, k, v, mask=None, bias=None, keep=None, *, precision=None, heads_sharing_kv=1):
    """q `[Lq, d_k]`, k `[Lk, d_k]`, v `[Lk, d_v]`; mask/bias/keep `[Lq|1, Lk|1]` -> (out `[Lq, d_v]`, weights `[Lq, Lk]`).

    `keep` is the dropout multiplier (keep-mask / keep_prob); the weights returned are pre-dropout.
    `heads_sharing_kv`: how many query heads a `vmap` maps over this k/v (GQA's H/G); they batch
    into a real matrix product, so one query each is not a matrix-vector product.
    """
    d_k = q.shape[-1]
    one_narrow_row = heads_sharing_kv == 1 and _one_narrow_row(q)
    logits = scores(q * jnp.asarray(1 / math.sqrt(d_k), q.dtype), k, precision, one_narrow_row)
    weights = softmax(logits, mask, bias).astype(v.dtype)
    dropped = weights if keep is None else weights * keep
    if one_narrow_row:
        return jnp.sum(dropped.T.astype(jnp.float32) * v.astype(jnp.float32), axis=0, keepdims=True), weights
    out = jnp.einsum("qk,kd->qd", dropped, v, precision=precision, preferred_element_type=logits_dtype(v.dtype))
    return out, weights


def _one_narrow_row(x):
    """One query in a narrow dtype (a bfloat16 decode step): XLA:CPU computes that matrix-vector product
    in float32 after converting all of K (or V) in a pass of its own, which doubles a step's cache
    traffic; a float32 product summed in float32 (exact for bf16 inputs) fuses the conversion into
    the one read instead (results/kv_decode.md)."""
    return x.shape[0] == 1 and logits_dtype(x.dtype) != x.dtype


def scores(q, k, precision, one_narrow_row=False):
    """q kᵀ in float32 (at least); computed as (k qᵀ)ᵀ when the queries are few."""
    if one_narrow_row:
        return jnp.sum(q.astype(jnp.float32) * k.astype(jnp.float32), axis=-1)[None]
    if q.shape[0] <= FEW_QUERIES_PER_KEY * k.shape[0]:
        return jnp.einsum("kd,qd->kq", k, q, precision=precision, preferred_element_type=logits_dtype(q.dtype)).T
    return jnp.einsum("qd,kd->qk", q, k, precision=precision, preferred_element_type=logits_dtype(q.dtype))


def softmax(logits, mask, bias):
    """Softmax over the last axis of biased logits, masked entries (mask False) at `finfo.min`."""
    if bias is not None:
        logits = logits + bias.astype(logits.dtype)
    if mask is not None:
        logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    return jax.nn.softmax(logits, axis=-1)


def logits_dtype(dtype):
    return jnp.promote_types(dtype, jnp.float32)


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
