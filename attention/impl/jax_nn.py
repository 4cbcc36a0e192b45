"""`impl="xla"` / `"cudnn"`: `jax.nn.dot_product_attention` with that implementation.

It has no attention dropout, no precision argument (scoped through the default matmul
precision instead) and needs d_v == d_k; it takes K/V `[B, Lk, G, D]` ("BTNH", as its table entry says:
`attention.core.to_grouped` puts them in it) and GQA natively.

cuDNN's flash attention refuses more than XLA does; `check_cudnn` names each refusal
(field, value, what is expected) before cuDNN's own, unnamed errors. The limits are those
JAX's cuDNN wrapper checks (`jax/_src/cudnn/fused_attention_stablehlo.py`: `check_layout`,
`check_is_flash_attention`, and `jax.nn.dot_product_attention`'s window rule).
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
from jax import lax

from attention.head import is_nvidia_gpu, target

CUDNN_DTYPES = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


def attention(q, k, v, mask, bias, options, *, implementation):
    """The `attention.core` signature, k and v "BTNH" `[B, Lk, G, D]`; weights are not exposed (None)."""
    platform = options.formulation.platform  # the program's target, where the caller named it
    if implementation == "cudnn" and not is_nvidia_gpu(platform):
        where = (
            f"the formulation's platform is {platform!r}" if platform else f"JAX's default backend is {target(None)!r}"
        )
        raise ValueError(f"impl='cudnn' needs an NVIDIA GPU, but {where}; use impl='xla', 'vmap' or 'einsum'")
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
    Lk = k.shape[1]
    if implementation == "cudnn":
        check_cudnn(q, k, v, options, max_head_dim=cudnn_max_head_dim(platform))
        # cuDNN adds masks and biases as one [B|1, H|1, Lq, Lk] bias: its query and key axes
        # cannot broadcast, so a padding mask [.., 1, Lk] is spread here; the bias is cast to
        # the inputs' dtype, the one cuDNN computes in.
        full = lambda x: None if x is None else jnp.broadcast_to(x, (*x.shape[:-2], Lq, Lk))
        mask = full(mask)
        bias = None if bias is None else full(bias).astype(q.dtype)
    heads_flat = lambda x: None if x is None else x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])
    with _matmul_precision(options.precision):
        out = jax.nn.dot_product_attention(
            q.reshape(B, Lq, G * R, d_k),
            k,
            v,
            bias=heads_flat(bias),
            mask=heads_flat(mask),
            is_causal=options.is_causal,
            local_window_size=options.window,
            implementation=implementation,
        )
    return out.reshape(B, Lq, G, R, v.shape[-1]), None


xla = functools.partial(attention, implementation="xla")
cudnn = functools.partial(attention, implementation="cudnn")


def check_cudnn(q, k, v, options, *, max_head_dim):
    """Raise a ValueError naming what cuDNN's flash attention would refuse; shapes as `attention`.

    A pure check of shapes, dtypes and options (no GPU needed), so it is tested on any backend.
    cuDNN's backward additionally refuses a mask or bias with an odd Lq or Lk; that is left to
    cuDNN, since the forward pass (decoding, Lq = 1) runs with them.
    """
    dtypes = {jnp.dtype(x.dtype) for x in (q, k, v)}
    if len(dtypes) != 1 or next(iter(dtypes)) not in CUDNN_DTYPES:
        got = ", ".join(sorted(str(d) for d in dtypes))
        raise ValueError(
            f"impl='cudnn': query/key/value dtype is {got}; cuDNN's flash attention expects "
            "float16 or bfloat16 for all three (set the model's dtype to bfloat16, or use impl='xla')"
        )
    d_k = q.shape[-1]
    if d_k % 8 or d_k > max_head_dim:
        raise ValueError(
            f"impl='cudnn': head_dim = {d_k}; cuDNN's flash attention expects a multiple of 8 and "
            f"at most {max_head_dim} on this GPU (use impl='xla' or 'vmap')"
        )
    if options.window is not None:
        left, right = options.window
        if right != 0 and not options.is_causal:
            raise ValueError(
                f"impl='cudnn': local_window_size = {options.window}; cuDNN expects no right window "
                "(right = 0) unless the attention is causal (use impl='xla' or 'blockwise')"
            )


def cudnn_max_head_dim(platform: str | None = None) -> int:
    """256 from Hopper (compute capability 9.0) on, 128 before: JAX's `check_is_flash_attention`.

    platform: the program's target as its formulation names it. The device is read only where it
    is the target: `platform` None, or naming the backend this process runs (a GPU run). A program
    compiled for a GPU from another host (ahead of time, on a CPU) cannot read its target's compute
    capability while tracing, so it gets 128, the limit every GPU with cuDNN flash attention accepts.
    """
    if (
        platform is not None
        and target(platform) != target(None)
        and not (is_nvidia_gpu(platform) and is_nvidia_gpu(None))
    ):
        return 128
    device = jax.devices()[0]
    capability = getattr(device, "compute_capability", None)
    if capability is None:
        return 128
    major = int(str(capability).split(".")[0])
    return 256 if major >= 9 else 128


def _matmul_precision(precision):
    """jax.nn takes no precision argument; scope the default matmul precision instead."""
    if precision is None:
        return contextlib.nullcontext()
    if isinstance(precision, lax.Precision):
        return jax.default_matmul_precision(precision.name.lower())
    if isinstance(precision, str):
        return jax.default_matmul_precision(precision)
    raise ValueError(f"precision for impl 'xla'/'cudnn' must be None, a lax.Precision or its name, got {precision!r}")
