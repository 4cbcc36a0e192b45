"""`attend`: multi-head, grouped-query and multi-query attention over one table of implementations.

`attend` checks its arguments once, turns the mask to bool, puts q/k/v into the grouped layout the
implementations compute in (below) and calls the implementation `impl` names (`IMPLEMENTATIONS`,
`attention.impl`): "vmap" (`attention.head.vmapped`, the one-head formula vmapped), "einsum",
"xla" / "cudnn" (`jax.nn.dot_product_attention`), "blockwise" (O(N) memory), or "auto"
(`choose_impl`). All compute the same function; docs/attention.md lists where they differ.

The grouped layout: query heads are grouped by the key/value head they share (R = H / G a group),
the batch axes flattened into B:

    q `[B, Lq, G, R, d_k]`   k, v `[B, G, Lk, D]` ("BNTH") or `[B, Lk, G, D]` ("BTNH")
    mask, bias `[B|1, G|1, R|1, Lq|1, Lk|1]`   out `[B, Lq, G, R, d_v]`   weights `[B, G, R, Lq, Lk]` or None

and every implementation is `implementation(q, k, v, mask, bias, options: Options) -> (out, weights)`.
"BTNH" is Flax's and the projections' K/V layout, "BNTH" (heads first) the decode cache's, in which
GQA/MQA never repeat K/V; `relayout` is the one K/V transpose, done where the two differ.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from attention.geometry import is_positive_int
from attention.head import Formulation, Options, is_nvidia_gpu, resolve
from attention.impl import IMPLEMENTATIONS
from attention.impl.blockwise import DEFAULT_BLOCK_K, DEFAULT_BLOCK_Q
from attention.masks import as_bool_mask, check_float_like, normalize_window

IMPLS = (*IMPLEMENTATIONS, "auto")
# impl="auto" on CPU: blockwise once Lq * Lk reaches these many logits per head, vmap below;
# the crossovers of the forward+backward ratios in results/attention_bench.md.
AUTO_BLOCKWISE_LOGITS = 1024 * 1024
AUTO_BLOCKWISE_LOGITS_SKIPPING = 512 * 512


def attend(
    query: ArrayLike,
    key: ArrayLike,
    value: ArrayLike,
    *,
    mask: ArrayLike | None = None,
    bias: ArrayLike | None = None,
    is_causal: bool = False,
    local_window_size: int | tuple[int, int] | None = None,
    impl: str = "vmap",
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    deterministic: bool = True,
    dtype: Any = None,
    precision: Any = None,
    broadcast_dropout: bool = True,
    block_q: int = DEFAULT_BLOCK_Q,
    block_k: int = DEFAULT_BLOCK_K,
    formulation: Formulation | None = None,
    kv_layout: str = "BTNH",
) -> tuple[jax.Array, jax.Array | None]:
    """Multi-head, grouped-query or multi-query attention, and its weights.

    Args:
      query, key, value: `[batch..., Lq, H, Dk]`, `[batch..., Lk, G, Dk]`, `[batch..., Lk, G, Dv]`
        with `H % G == 0` (G == H: MHA, 1 < G < H: GQA, G == 1: MQA); key and value
        `[batch..., G, Lk, D]` with `kv_layout="BNTH"`.
      mask: broadcastable to `[batch..., H, Lq, Lk]`; bool (True = attend) or, as in Flax,
        numeric with non-zero = attend (`attention.masks`). Additive masks go in `bias`.
      bias: float, broadcastable to `[batch..., H, Lq, Lk]`; added to the logits.
      is_causal: query i attends keys j <= i (top-left aligned, as `jax.nn`). ANDed with `mask`.
      local_window_size: `w` or `(left, right)`: query i attends keys i-left..i+right.
      dropout_rate, dropout_rng, deterministic, broadcast_dropout: attention-weight dropout,
        as in Flax (`broadcast_dropout` shares one keep-mask over batch and heads).
      dtype, precision: computation dtype (default: promoted from the inputs); the matmuls' `lax.Precision`.
      impl, block_q, block_k: one of `IMPLS`; blockwise's query / key block lengths (clipped to Lq / Lk).
      formulation: how vmap spells a head's products (`attention.head`; None: plain).
      kv_layout: "BTNH" (Flax's, the default) or "BNTH" (heads first, as `attention.cache` stores
        them: a decode step's cache is read without a transpose).

    Returns:
      (out `[batch..., Lq, H, Dv]` in `dtype`, weights `[batch..., H, Lq, Lk]` or None).
      The weights are pre-dropout (what Flax sows) and None for the `jax.nn` and blockwise
      implementations (and for "auto" when it picks one of them); unused, they cost nothing
      under `jit`.
    """
    query, key, value, dtype = _cast(query, key, value, dtype)
    impl = _check_impl(impl, dtype)
    batch, (Lq, H, Dk), (Lk, G), Dv = _check_shapes(query, key, value, kv_layout)
    logits_shape = (*batch, H, Lq, Lk)
    mask = as_bool_mask("mask", mask, logits_shape)
    bias = None if bias is None else jnp.asarray(bias)
    check_float_like("bias", bias, logits_shape)
    dropout = _dropout_active(dropout_rate, dropout_rng, deterministic)
    options = _options(
        is_causal,
        local_window_size,
        dropout_rate if dropout else 0.0,
        dropout_rng if dropout else None,
        broadcast_dropout,
        precision,
        block_q,
        block_k,
        formulation,
    )
    if impl == "auto":
        impl = choose_impl(
            Lq,
            Lk,
            dtype,
            Dk,
            Dv,
            dropout,
            bias is not None,
            skips_blocks=is_causal or options.window is not None,
            platform=options.formulation.platform,
        )
    implementation = IMPLEMENTATIONS[impl]
    out, weights = implementation.attention(
        *to_grouped(query, key, value, kv_layout, implementation.kv_layout),
        group_heads(mask, batch, G),
        group_heads(bias, batch, G),
        options,
    )
    out = out.astype(dtype).reshape(*batch, Lq, H, Dv)
    return out, None if weights is None else weights.reshape(logits_shape)


def dot_product_attention(query: ArrayLike, key: ArrayLike, value: ArrayLike, **options: Any) -> jax.Array:
    """`attend`'s output `[batch..., Lq, H, Dv]` without the weights; the same arguments."""
    out, _ = attend(query, key, value, **options)
    return out


# inspect.signature reads __signature__, which typeshed does not declare on functions
dot_product_attention.__signature__ = inspect.signature(attend).replace(  # type: ignore[attr-defined]
    return_annotation=jax.Array
)


def _options(
    is_causal, local_window_size, dropout_rate, dropout_rng, broadcast_dropout, precision, block_q, block_k, formulation
) -> Options:
    """The checked `Options` every implementation takes."""
    for name, size in (("block_q", block_q), ("block_k", block_k)):
        if not is_positive_int(size):
            raise ValueError(f"{name} must be a positive int, got {size!r}")
    return Options(
        is_causal,
        normalize_window(local_window_size),
        dropout_rate,
        dropout_rng,
        broadcast_dropout,
        precision,
        block_q,
        block_k,
        resolve(formulation),
    )


def _check_impl(impl, dtype):
    """`impl`, checked; "auto" with complex inputs runs "vmap" (Flax's algebra: q.k without conjugate)."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if jnp.issubdtype(dtype, jnp.complexfloating) and impl not in ("vmap", "einsum"):
        if impl != "auto":
            raise ValueError(f"complex inputs ({dtype}) need impl='vmap' or 'einsum', got impl={impl!r}")
        return "vmap"
    return impl


def _cast(query, key, value, dtype):
    query, key, value = (jnp.asarray(x) for x in (query, key, value))
    dtype = jnp.dtype(dtype) if dtype is not None else jnp.result_type(query, key, value)
    if not jnp.issubdtype(dtype, jnp.inexact):
        raise ValueError(f"dtype must be floating point or complex, got {dtype}")
    return (*(x.astype(dtype) for x in (query, key, value)), dtype)


def _check_shapes(query, key, value, kv_layout):
    """-> (batch, (Lq, H, Dk), (Lk, G), Dv), or a ValueError naming the disagreement."""
    if not query.ndim == key.ndim == value.ndim >= 3:
        raise ValueError(
            "query, key and value must have the same rank >= 3 ([batch..., L, heads, dim]), got "
            f"shapes {query.shape}, {key.shape}, {value.shape}"
        )
    batch = query.shape[:-3]
    if key.shape[:-3] != batch or value.shape[:-3] != batch:
        raise ValueError(f"batch axes differ: query {query.shape}, key {key.shape}, value {value.shape}")
    Lq, H, Dk = query.shape[-3:]
    Lk, G = (key.shape[axis] for axis in kv_axes(kv_layout))
    if value.shape[:-1] != key.shape[:-1]:
        raise ValueError(f"key {key.shape} and value {value.shape} must agree on all but the last axis")
    if key.shape[-1] != Dk:
        raise ValueError(f"query and key head dims differ: {Dk} vs {key.shape[-1]}")
    if G < 1 or H % G:
        raise ValueError(f"query heads ({H}) must be a multiple of key/value heads ({G})")
    return batch, (Lq, H, Dk), (Lk, G), value.shape[-1]


def _dropout_active(rate, rng, deterministic):
    """Validate the dropout arguments; True when dropout acts."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"dropout_rate must be in [0, 1), got {rate}")
    if deterministic or rate == 0.0:
        return False
    if rng is None:
        raise ValueError("dropout_rng is required when deterministic=False and dropout_rate > 0")
    return True


def choose_impl(
    query_length: int,
    key_length: int,
    dtype: Any,
    key_dim: int,
    value_dim: int,
    dropout: bool,
    has_bias: bool,
    skips_blocks: bool = False,
    platform: str | None = None,
) -> str:
    """What `impl="auto"` runs: cuDNN on an NVIDIA GPU where it applies, else blockwise or vmap by size.

    `skips_blocks` (causal or sliding window) lowers the blockwise threshold, because
    blockwise then skips the blocks the dense paths compute and mask. `platform`: the JAX
    platform the program is for, as the caller's formulation names it (`Formulation.platform`,
    chosen by `backends.model_hooks`); None: the process's default backend.
    """
    if is_nvidia_gpu(platform):
        cudnn_ok = (
            jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
            and key_dim == value_dim
            and key_dim <= 128
            and key_dim % 8 == 0
            and not dropout
            and not has_bias
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


# --- the grouped layout ------------------------------------------------------------------------------


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


# --- the layers' settings ------------------------------------------------------------------------------


def check_layer_settings(owner: str, geometry, *, impl: str, block_sizes, fused_qkv: bool, dropout_rate: float) -> dict:
    """Validate what both faces take beyond Flax's arguments; return `attend`'s block-size keywords."""
    if impl not in IMPLS:
        raise ValueError(f"{owner}impl must be one of {IMPLS}, got {impl!r}")
    if block_sizes is not None and not (
        isinstance(block_sizes, (tuple, list)) and len(block_sizes) == 2 and all(map(is_positive_int, block_sizes))
    ):
        raise ValueError(f"{owner}block_sizes = {block_sizes!r}; expected None or (block_q, block_k), positive ints")
    if fused_qkv and geometry.v_head_dim != geometry.head_dim:
        raise ValueError(
            f"{owner}v_head_dim = {geometry.v_head_dim}; fused_qkv=True needs v_head_dim None "
            f"or head_dim ({geometry.head_dim}): q, k and v share one kernel"
        )
    if not 0.0 <= dropout_rate < 1.0:
        raise ValueError(f"{owner}dropout_rate = {dropout_rate!r}; expected a float in [0, 1)")
    return {} if block_sizes is None else dict(zip(("block_q", "block_k"), block_sizes))
