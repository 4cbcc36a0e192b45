"""The grouped layout the implementations compute in, the K/V layouts, and the options they all take.

Query heads are grouped by the key/value head they share (R = H / G of them per group):

    q `[B, Lq, G, R, d_k]`   k `[B, G, Lk, d_k]`   v `[B, G, Lk, d_v]`   ("BNTH"; "BTNH": `[B, Lk, G, D]`)
    mask, bias `[B|1, G|1, R|1, Lq|1, Lk|1]`   (size-1 axes broadcast)
    out `[B, Lq, G, R, d_v]`   weights `[B, G, R, Lq, Lk]` (or None)

with the batch axes flattened into B. K/V come in one of two layouts, named as in JAX's cuDNN
wrapper (`KV_LAYOUTS`): "BTNH" `[batch..., Lk, G, D]`, Flax's and the projections', or "BNTH"
`[batch..., G, Lk, D]`, heads first, the decode cache's (`attention.cache`), in which GQA/MQA never
repeat K/V and a decode step reads each KV head's cache contiguously. The vmap, einsum and blockwise
implementations compute in "BNTH"; `jax.nn`'s takes "BTNH" (`attention.impl.Implementation.kv_layout`).
`to_grouped` is where a caller's layout meets an implementation's: `relayout` is the one K/V
transpose, done there when the two differ (and where the cache is written). Every implementation is a function

    implementation(q, k, v, mask, bias, options: Options) -> (out, weights or None)
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from attention.formulation import PLAIN
from attention.masks import and_masks, structure_mask


class Options(NamedTuple):
    """What an implementation needs besides the arrays; checked by `attention.attend`."""

    is_causal: bool
    window: tuple[int, int] | None  # (left, right)
    dropout_rate: float  # 0.0 when dropout is off
    dropout_rng: jax.Array | None  # None when dropout is off
    broadcast_dropout: bool
    precision: Any
    block_q: int
    block_k: int
    formulation: Any = PLAIN  # attention.formulation.Formulation: how the products are spelled


KV_LAYOUTS = ("BTNH", "BNTH")  # K/V `[batch..., Lk, G, D]` (Flax's) or `[batch..., G, Lk, D]` (the cache's)


def kv_axes(kv_layout: str) -> tuple[int, int]:
    """(length axis, heads axis) of a key/value array in `kv_layout`; a ValueError for another layout."""
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(
            f"kv_layout = {kv_layout!r}; expected 'BTNH' (key/value [batch..., Lk, G, D], Flax's) "
            "or 'BNTH' ([batch..., G, Lk, D], the decode cache's)"
        )
    return (-3, -2) if kv_layout == "BTNH" else (-2, -3)


def relayout(x: jax.Array, source: str, target: str) -> jax.Array:
    """A key or value array from layout `source` to `target` (`KV_LAYOUTS`): the one K/V transpose."""
    return x if source == target else jnp.swapaxes(x, -3, -2)


def to_grouped(query, key, value, kv_layout="BTNH", impl_layout="BNTH"):
    """q `[batch..., Lq, H, d_k]`, k/v in `kv_layout` -> (q, k, v) grouped, k/v in `impl_layout`, B = prod(batch)."""
    batch, (Lq, H, d_k), G = query.shape[:-3], query.shape[-3:], key.shape[kv_axes(kv_layout)[1]]
    B = math.prod(batch)
    q = query.reshape(B, Lq, G, H // G, d_k)
    k, v = (relayout(x, kv_layout, impl_layout) for x in (key, value))
    return q, k.reshape(B, *k.shape[-3:]), v.reshape(B, *v.shape[-3:])


def group_heads(x, batch, G):
    """Mask-like `[batch..., H|1, Lq|1, Lk|1]` (maybe fewer axes) -> `[B|1, G|1, R|1, Lq|1, Lk|1]`."""
    x = flatten_batch(x, batch)
    if x is None:
        return None
    Bx, Hx, Lqx, Lkx = x.shape
    groups = (G, Hx // G) if Hx != 1 else (1, 1)
    return x.reshape(Bx, *groups, Lqx, Lkx)


def flatten_batch(x, batch):
    """Mask-like `[batch..., H|1, Lq|1, Lk|1]` (maybe fewer axes) -> `[B|1, H|1, Lq|1, Lk|1]`."""
    if x is None:
        return None
    x = x.reshape((1,) * (len(batch) + 3 - x.ndim) + x.shape)
    if all(s == 1 for s in x.shape[:-3]):
        return x.reshape(1, *x.shape[-3:])
    return jnp.broadcast_to(x, (*batch, *x.shape[-3:])).reshape(math.prod(batch), *x.shape[-3:])


def with_structure(mask, options, Lq, Lk):
    """`mask` ANDed with the causal / window structure, as a 5-axis grouped mask (or None)."""
    mask = and_masks(mask, structure_mask(Lq, Lk, options.is_causal, options.window))
    return None if mask is None else mask.reshape((1,) * (5 - mask.ndim) + mask.shape)
