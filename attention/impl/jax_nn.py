"""`impl="xla"` / `"cudnn"`: `jax.nn.dot_product_attention` with that implementation.

It has no attention dropout, no precision argument (scoped through the default matmul
precision instead) and needs d_v == d_k; it takes K/V `[B, Lk, G, D]` and GQA natively.
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
from jax import lax


def attention(q, k, v, mask, bias, options, *, implementation):
    """The `attention.grouped` signature; weights are not exposed (None)."""
    if implementation == "cudnn" and jax.default_backend() != "gpu":
        raise ValueError(
            f"impl='cudnn' needs an NVIDIA GPU, but JAX's default backend is "
            f"{jax.default_backend()!r}; use impl='xla', 'vmap' or 'einsum'"
        )
    if options.dropout_rate:
        raise ValueError(
            f"impl={implementation!r} has no attention dropout (jax.nn.dot_product_attention "
            "lacks it); use impl='vmap' or 'einsum', or dropout_rate=0"
        )
    if v.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"impl={implementation!r} needs equal key and value head dims (v_head_dim == head_dim), "
            f"got {k.shape[-1]} and {v.shape[-1]}; use impl='vmap', 'einsum' or 'blockwise'"
        )
    B, Lq, G, R, d_k = q.shape
    heads_flat = lambda x: None if x is None else x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])
    with _matmul_precision(options.precision):
        out = jax.nn.dot_product_attention(
            q.reshape(B, Lq, G * R, d_k), jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2),
            bias=heads_flat(bias), mask=heads_flat(mask), is_causal=options.is_causal,
            local_window_size=options.window, implementation=implementation,
        )
    return out.reshape(B, Lq, G, R, v.shape[-1]), None


xla = functools.partial(attention, implementation="xla")
cudnn = functools.partial(attention, implementation="cudnn")


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
