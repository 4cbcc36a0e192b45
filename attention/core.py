"""Scaled dot-product attention, written once for one head and mapped over the rest.

Every `impl` computes the same function; they differ only in how XLA sees it:

* `"vmap"`   -- `_one_head` (q [Lq, Dk], k [Lk, Dk], v [Lk, Dv]) `jax.vmap`-ed over the
  query heads sharing a KV head, over KV groups, then over batch. K/V are mapped with
  `in_axes=None` at the inner level, so GQA/MQA never materialise repeated K/V.
* `"einsum"` -- the same algebra as one batched einsum pair over `[B, G, H/G, ...]`.
* `"xla"` / `"cudnn"` -- `jax.nn.dot_product_attention` with that implementation.
* `"blockwise"` -- `attention.blockwise`: query/key blocks, online softmax, a backward that
  recomputes blocks; causal/window blocks outside the structure are skipped. O(N) memory.
* `"auto"` -- `choose_impl`: cuDNN on GPU where it applies, blockwise for long sequences,
  vmap for short ones (thresholds from `bench/attention.py`); the choice is logged once.

Conventions shared by all paths: logits and softmax in float32 (at least), masked
logits filled with `finfo(float32).min`, so a query row whose keys are *all* masked
gets uniform weights over every key (its output is the mean of V) -- finite, and the
same as Flax and `jax.nn`. Attention dropout (vmap/einsum) draws its keep-mask
exactly as `flax.linen.dot_product_attention_weights` does, so the same `dropout_rng`
gives the same result as Flax; blockwise draws it per block (same distribution, other draws).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from attention.blockwise import DEFAULT_BLOCK_K, DEFAULT_BLOCK_Q, blockwise_attention
from attention.masks import and_masks, as_bool_mask, check_float_like, normalize_window, structure_mask

Array = Any
IMPLS = ("vmap", "einsum", "xla", "cudnn", "blockwise", "auto")
# impl="auto" on CPU: blockwise once Lq * Lk reaches these many logits per head, vmap below;
# from bench/attention.py forward+backward ratios to XLA (results/attention_bench.md):
# full attention, vmap 1.01 vs blockwise 1.17 at N = 512 and 0.99 vs 0.92 at N = 1024;
# causal (blocks skipped), vmap 0.91 vs blockwise 1.11 at N = 128 and 1.00 vs 0.82 at N = 512.
AUTO_BLOCKWISE_LOGITS = 1024 * 1024
AUTO_BLOCKWISE_LOGITS_SKIPPING = 512 * 512


def dot_product_attention(
    query: Array,
    key: Array,
    value: Array,
    *,
    mask: Array | None = None,
    bias: Array | None = None,
    is_causal: bool = False,
    local_window_size: int | tuple[int, int] | None = None,
    impl: str = "vmap",
    dropout_rate: float = 0.0,
    dropout_rng: Array | None = None,
    deterministic: bool = True,
    dtype: Any = None,
    precision: Any = None,
    broadcast_dropout: bool = True,
    block_q: int = DEFAULT_BLOCK_Q,
    block_k: int = DEFAULT_BLOCK_K,
) -> Array:
    """Multi-head, grouped-query or multi-query attention.

    Args:
      query: `[batch..., Lq, H, Dk]`.
      key: `[batch..., Lk, G, Dk]` with `H % G == 0` (G == H: MHA, 1 < G < H: GQA, G == 1: MQA).
      value: `[batch..., Lk, G, Dv]`.
      mask: broadcastable to `[batch..., H, Lq, Lk]`; bool (True = attend) or, as in Flax,
        numeric with non-zero = attend (`attention.masks`). Additive masks go in `bias`.
      bias: float, broadcastable to `[batch..., H, Lq, Lk]`; added to the logits.
      is_causal: query i attends keys j <= i (top-left aligned, as `jax.nn`). ANDed with `mask`.
      local_window_size: `w` or `(left, right)`: query i attends keys i-left..i+right.
      impl: one of `IMPLS`.
      dropout_rate, dropout_rng, deterministic, broadcast_dropout: attention-weight dropout,
        as in Flax (`broadcast_dropout` shares one keep-mask over batch and heads).
      dtype: computation dtype (default: promoted from the inputs).
      precision: `lax.Precision` (or its name) for the matmuls.
      block_q, block_k: query / key block lengths of `impl="blockwise"` (clipped to Lq / Lk).

    Returns:
      `[batch..., Lq, H, Dv]` in `dtype`.
    """
    out, _ = attend(
        query, key, value, mask=mask, bias=bias, is_causal=is_causal,
        local_window_size=local_window_size, impl=impl, dropout_rate=dropout_rate,
        dropout_rng=dropout_rng, deterministic=deterministic, dtype=dtype,
        precision=precision, broadcast_dropout=broadcast_dropout, block_q=block_q,
        block_k=block_k,
    )
    return out


def attend(
    query: Array,
    key: Array,
    value: Array,
    *,
    mask: Array | None = None,
    bias: Array | None = None,
    is_causal: bool = False,
    local_window_size: int | tuple[int, int] | None = None,
    impl: str = "vmap",
    dropout_rate: float = 0.0,
    dropout_rng: Array | None = None,
    deterministic: bool = True,
    dtype: Any = None,
    precision: Any = None,
    broadcast_dropout: bool = True,
    block_q: int = DEFAULT_BLOCK_Q,
    block_k: int = DEFAULT_BLOCK_K,
    kv_heads_first: bool = False,
) -> tuple[Array, Array | None]:
    """`dot_product_attention` that also returns the weights `[batch..., H, Lq, Lk]`.

    The weights are pre-dropout (what Flax sows) and None for the `jax.nn` and blockwise
    backends (and for "auto" when it picks one of them).
    Unused weights cost nothing under `jit`. `kv_heads_first=True` takes key/value as
    `[batch..., G, Lk, D]`, the layout of the decode cache, without transposing them.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    query, key, value = (jnp.asarray(x) for x in (query, key, value))
    dtype = jnp.dtype(dtype) if dtype is not None else jnp.result_type(query, key, value)
    if not jnp.issubdtype(dtype, jnp.inexact):
        raise ValueError(f"dtype must be floating point or complex, got {dtype}")
    if jnp.issubdtype(dtype, jnp.complexfloating) and impl not in ("vmap", "einsum"):
        if impl != "auto":  # complex: Flax's algebra (q.k without conjugate, complex softmax)
            raise ValueError(f"complex inputs ({dtype}) need impl='vmap' or 'einsum', got impl={impl!r}")
        impl = "vmap"
    query, key, value = (x.astype(dtype) for x in (query, key, value))

    batch, (Lq, H, Dk), (G, Lk) = _check_shapes(query, key, value, kv_heads_first)
    window = normalize_window(local_window_size)
    logits_shape = (*batch, H, Lq, Lk)
    mask = as_bool_mask("mask", mask, logits_shape)
    bias = None if bias is None else jnp.asarray(bias)
    check_float_like("bias", bias, logits_shape)
    dropout = _dropout_active(dropout_rate, dropout_rng, deterministic)
    for name, size in (("block_q", block_q), ("block_k", block_k)):
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"{name} must be a positive int, got {size!r}")
    if impl == "auto":
        impl = choose_impl(Lq, Lk, dtype, Dk, value.shape[-1], dropout, bias is not None,
                           skips_blocks=is_causal or window is not None)

    if impl == "blockwise":
        grouped = [_group_heads(x, batch, G) for x in (mask, bias)]
        if not kv_heads_first:
            key, value = jnp.swapaxes(key, -3, -2), jnp.swapaxes(value, -3, -2)
        B = math.prod(batch)
        out = blockwise_attention(
            query.reshape(B, Lq, G, H // G, Dk), key.reshape(B, G, Lk, Dk),
            value.reshape(B, G, Lk, value.shape[-1]), *grouped, is_causal=is_causal,
            window=window, block_q=block_q, block_k=block_k,
            dropout_rate=dropout_rate if dropout else 0.0, dropout_rng=dropout_rng if dropout else None,
            broadcast_dropout=broadcast_dropout, precision=precision,
        )
        return out.astype(dtype).reshape(*batch, Lq, H, value.shape[-1]), None

    keep = _dropout_multiplier(dropout, dropout_rate, dropout_rng, broadcast_dropout, logits_shape, dtype)
    if impl in ("xla", "cudnn"):
        if keep is not None:
            raise ValueError(
                f"impl={impl!r} has no attention dropout (jax.nn.dot_product_attention "
                "lacks it); use impl='vmap' or 'einsum', or dropout_rate=0"
            )
        out = _jax_nn(query, key, value, mask, bias, is_causal, window, impl, precision, kv_heads_first)
        return out, None

    mask = and_masks(mask, structure_mask(Lq, Lk, is_causal, window))
    B = math.prod(batch)
    q = query.reshape(B, Lq, G, H // G, Dk)
    k = key.reshape(B, *key.shape[-3:])
    v = value.reshape(B, *value.shape[-3:])
    grouped = [_group_heads(x, batch, G) for x in (mask, bias, keep)]
    compute = _vmap_heads if impl == "vmap" else _einsum_heads
    out, weights = compute(q, k, v, *grouped, precision=precision, kv_heads_first=kv_heads_first)
    out = out.astype(dtype).reshape(*batch, Lq, H, value.shape[-1])
    return out, weights.reshape(logits_shape)


def _check_shapes(query, key, value, kv_heads_first):
    if not query.ndim == key.ndim == value.ndim >= 3:
        raise ValueError(
            "query, key and value must have the same rank >= 3 ([batch..., L, heads, dim]), got "
            f"shapes {query.shape}, {key.shape}, {value.shape}"
        )
    batch = query.shape[:-3]
    if key.shape[:-3] != batch or value.shape[:-3] != batch:
        raise ValueError(
            f"batch axes differ: query {query.shape}, key {key.shape}, value {value.shape}"
        )
    Lq, H, Dk = query.shape[-3:]
    G, Lk = key.shape[-3:-1][::-1] if not kv_heads_first else key.shape[-3:-1]
    if value.shape[:-1] != key.shape[:-1]:
        raise ValueError(
            f"key {key.shape} and value {value.shape} must agree on all but the last axis"
        )
    if key.shape[-1] != Dk:
        raise ValueError(f"query and key head dims differ: {Dk} vs {key.shape[-1]}")
    if G < 1 or H % G:
        raise ValueError(
            f"query heads ({H}) must be a multiple of key/value heads ({G})"
        )
    return batch, (Lq, H, Dk), (G, Lk)


def choose_impl(
    query_length: int,
    key_length: int,
    dtype: Any,
    key_dim: int,
    value_dim: int,
    dropout: bool,
    has_bias: bool,
    skips_blocks: bool = False,
) -> str:
    """What `impl="auto"` runs: cuDNN on GPU where it applies, else blockwise or vmap by size.

    `skips_blocks` (causal or sliding window) lowers the blockwise threshold, because
    blockwise then skips the blocks the dense paths compute and mask.
    """
    if jax.default_backend() == "gpu":
        cudnn_ok = (
            jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
            and key_dim == value_dim and key_dim <= 128 and key_dim % 8 == 0
            and not dropout and not has_bias
        )
        if cudnn_ok:
            return _log_choice("cudnn", "GPU, half precision, head dim <= 128, no dropout or bias")
    threshold = AUTO_BLOCKWISE_LOGITS_SKIPPING if skips_blocks else AUTO_BLOCKWISE_LOGITS
    kind = "causal/window" if skips_blocks else "full"
    if query_length * key_length >= threshold:
        return _log_choice("blockwise", f"{kind} attention, Lq * Lk >= {threshold}")
    return _log_choice("vmap", f"{kind} attention, Lq * Lk < {threshold}")


@functools.cache
def _log_choice(impl, reason):
    """Log each distinct choice of impl="auto" once per process."""
    logging.getLogger(__name__).info("attention impl='auto' uses %r (%s)", impl, reason)
    return impl


def _dropout_active(rate, rng, deterministic):
    """Validate the dropout arguments; True when dropout acts."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"dropout_rate must be in [0, 1), got {rate}")
    if deterministic or rate == 0.0:
        return False
    if rng is None:
        raise ValueError("dropout_rng is required when deterministic=False and dropout_rate > 0")
    return True


def _dropout_multiplier(active, rate, rng, broadcast, logits_shape, dtype):
    """Keep-mask / keep_prob, drawn as Flax draws it; None when dropout is off."""
    if not active:
        return None
    keep_prob = 1.0 - rate
    shape = (1,) * (len(logits_shape) - 2) + logits_shape[-2:] if broadcast else logits_shape
    keep = jax.random.bernoulli(rng, keep_prob, shape)
    return keep.astype(dtype) / jnp.asarray(keep_prob, dtype=dtype)


def _flatten_batch(x, batch):
    """Mask-like `[batch..., H|1, Lq|1, Lk|1]` (maybe fewer axes) -> `[B|1, H|1, Lq|1, Lk|1]`."""
    if x is None:
        return None
    x = x.reshape((1,) * (len(batch) + 3 - x.ndim) + x.shape)
    if all(s == 1 for s in x.shape[:-3]):
        return x.reshape(1, *x.shape[-3:])
    return jnp.broadcast_to(x, (*batch, *x.shape[-3:])).reshape(math.prod(batch), *x.shape[-3:])


def _group_heads(x, batch, G):
    """Mask-like `[batch..., H|1, Lq|1, Lk|1]` -> `[B|1, G|1, H/G|1, Lq|1, Lk|1]`."""
    x = _flatten_batch(x, batch)
    if x is None:
        return None
    Bx, Hx, Lqx, Lkx = x.shape
    groups = (G, Hx // G) if Hx != 1 else (1, 1)
    return x.reshape(Bx, *groups, Lqx, Lkx)


def _attention_probs(logits, mask, bias):
    """float32 softmax of masked, biased logits (masked entries -> finfo.min)."""
    if bias is not None:
        logits = logits + bias.astype(logits.dtype)
    if mask is not None:
        logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    return jax.nn.softmax(logits, axis=-1)


def _logits_dtype(dtype):
    return jnp.promote_types(dtype, jnp.float32)


def _one_head(q, k, v, mask, bias, keep, *, precision, keys_as_lhs=False):
    """Attention for ONE head: q [Lq, Dk], k [Lk, Dk], v [Lk, Dv]; mask/bias/keep [Lq|1, Lk|1].

    Returns (out [Lq, Dv], weights [Lq, Lk]). `keys_as_lhs` computes the logits as (K Q^T)^T,
    for a few queries against a long cache: XLA:CPU then streams K instead of repacking it
    (GQA/MQA decode steps 20-30 % faster at a 4096-position cache, bench/decode.py).
    """
    q = q * jnp.asarray(1.0 / math.sqrt(q.shape[-1]), q.dtype)
    logits_type = _logits_dtype(q.dtype)
    if keys_as_lhs:
        logits = jnp.einsum("kd,qd->kq", k, q, precision=precision, preferred_element_type=logits_type).T
    else:
        logits = jnp.einsum("qd,kd->qk", q, k, precision=precision, preferred_element_type=logits_type)
    weights = _attention_probs(logits, mask, bias).astype(v.dtype)
    dropped = weights if keep is None else weights * keep
    out = jnp.einsum(
        "qk,kd->qd", dropped, v, precision=precision, preferred_element_type=_logits_dtype(v.dtype)
    )
    return out, weights


def _vmap_heads(q, k, v, mask, bias, keep, *, precision, kv_heads_first):
    """q [B, Lq, G, R, Dk]; k/v [B, Lk, G, D] (or [B, G, Lk, D]); mask-likes [B|1, G|1, R|1, ., .]."""
    extras = (mask, bias, keep)
    # per mapped level (batch, group, head-in-group): map a real axis, broadcast a size-1 one
    level_axes = [
        tuple(None if x is None or x.shape[level] == 1 else 0 for x in extras) for level in range(3)
    ]
    extras = tuple(_drop_broadcast_axes(x) for x in extras)
    kv_axis = 0 if kv_heads_first else 1
    # K/V heads first: the decode cache, few queries against many keys
    fn = functools.partial(_one_head, precision=precision, keys_as_lhs=kv_heads_first)
    # innermost: the query heads of one group share k/v (in_axes None: K/V are not repeated)
    fn = jax.vmap(fn, in_axes=(1, None, None, *level_axes[2]), out_axes=(1, 0))
    fn = jax.vmap(fn, in_axes=(1, kv_axis, kv_axis, *level_axes[1]), out_axes=(1, 0))
    fn = jax.vmap(fn, in_axes=(0, 0, 0, *level_axes[0]), out_axes=(0, 0))
    return fn(q, k, v, *extras)


def _drop_broadcast_axes(x):
    """Remove the size-1 axes among the three mapped leading axes (they are not mapped)."""
    if x is None:
        return None
    return x.reshape(*(s for s in x.shape[:3] if s != 1), *x.shape[3:])


def _einsum_heads(q, k, v, mask, bias, keep, *, precision, kv_heads_first):
    """Same contract as `_vmap_heads`, as two batched einsums.

    The logits are laid out `[B, G, Lq, R, Lk]`: the order a dot_general of q `[B, Lq, G, R, Dk]`
    produces natively, which keeps XLA from transposing the `Lq x Lk` matrices (2x faster).
    """
    kv = "bgkd" if kv_heads_first else "bkgd"
    to_logits_layout = lambda x: None if x is None else jnp.swapaxes(x, 2, 3)
    q = q * jnp.asarray(1.0 / math.sqrt(q.shape[-1]), q.dtype)
    logits = jnp.einsum(
        f"bqgrd,{kv}->bgqrk", q, k, precision=precision,
        preferred_element_type=_logits_dtype(q.dtype),
    )
    weights = _attention_probs(logits, to_logits_layout(mask), to_logits_layout(bias)).astype(v.dtype)
    keep = to_logits_layout(keep)
    dropped = weights if keep is None else weights * keep
    out = jnp.einsum(
        f"bgqrk,{kv}->bqgrd", dropped, v, precision=precision,
        preferred_element_type=_logits_dtype(v.dtype),
    )
    return out, jnp.swapaxes(weights, 2, 3)


def _jax_nn(query, key, value, mask, bias, is_causal, window, impl, precision, kv_heads_first):
    """`jax.nn.dot_product_attention(implementation=impl)` on flattened batch axes."""
    if impl == "cudnn" and jax.default_backend() != "gpu":
        raise ValueError(
            f"impl='cudnn' needs an NVIDIA GPU, but JAX's default backend is "
            f"{jax.default_backend()!r}; use impl='xla', 'vmap' or 'einsum'"
        )
    if kv_heads_first:
        key, value = jnp.swapaxes(key, -3, -2), jnp.swapaxes(value, -3, -2)
    if value.shape[-1] != key.shape[-1]:
        raise ValueError(
            f"impl={impl!r} needs equal key and value head dims, got {key.shape[-1]} and "
            f"{value.shape[-1]}; use impl='vmap' or 'einsum'"
        )
    batch = query.shape[:-3]
    flat = lambda x: x.reshape(math.prod(batch), *x.shape[-3:])
    mask, bias = (_flatten_batch(x, batch) for x in (mask, bias))
    with _matmul_precision(precision):
        out = jax.nn.dot_product_attention(
            flat(query), flat(key), flat(value), bias=bias, mask=mask, is_causal=is_causal,
            local_window_size=window, implementation=impl,
        )
    return out.reshape(query.shape[:-1] + (value.shape[-1],))


def _matmul_precision(precision):
    """jax.nn takes no precision argument; scope the default matmul precision instead."""
    if precision is None:
        return contextlib.nullcontext()
    if isinstance(precision, lax.Precision):
        return jax.default_matmul_precision(precision.name.lower())
    if isinstance(precision, str):
        return jax.default_matmul_precision(precision)
    raise ValueError(
        f"precision for impl 'xla'/'cudnn' must be None, a lax.Precision or its name, got {precision!r}"
    )
