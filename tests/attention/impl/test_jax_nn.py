"""`impl="cudnn"` (attention/impl/jax_nn.py; its `xla` twin is tested with every impl in tests/attention/test_core.py):
its named refusals (any backend) and, on a GPU, its numbers against the vmap path.

cuDNN computes in bfloat16/float16, so the GPU tests compare bfloat16 cuDNN with the vmap path run
on the same bfloat16-rounded inputs in float32 at full precision; the tolerance is a few bfloat16
ulps of outputs of size ~1 (2**-8 relative per rounding, a handful of roundings per output).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention
from attention.head import Options
from attention.impl import jax_nn

ON_GPU = jax.default_backend() == "gpu"
gpu_only = pytest.mark.skipif(not ON_GPU, reason="cuDNN runs on an NVIDIA GPU only")
BF16_ATOL = 3e-2


def options(**kw):
    fields = dict(
        is_causal=False,
        window=None,
        dropout_rate=0.0,
        dropout_rng=None,
        broadcast_dropout=True,
        precision=None,
        block_q=128,
        block_k=128,
    )
    return Options(**{**fields, **kw})


def grouped(dtype=jnp.bfloat16, d=64, lq=16, lk=16, groups=2, per_group=2):
    q = np.zeros((2, lq, groups, per_group, d), dtype)  # NumPy: float64 stays float64 without jax_enable_x64
    k = np.zeros((2, lk, groups, d), dtype)  # "BTNH", the layout jax.nn takes
    return q, k, k


@pytest.mark.parametrize(
    "arrays, opts, message",
    [
        (grouped(jnp.float32), options(), r"dtype is float32; .* expects float16 or bfloat16"),
        (grouped(np.float64), options(), r"dtype is float64; .* expects float16 or bfloat16"),
        (grouped(d=60), options(), r"head_dim = 60; .* multiple of 8 and at most 128"),
        (grouped(d=136), options(), r"head_dim = 136; .* at most 128"),
        (grouped(), options(window=(4, 2)), r"local_window_size = \(4, 2\); .* no right window"),
    ],
    ids=["float32", "float64", "head-dim-not-multiple-of-8", "head-dim-too-large", "right-window"],
)
def test_what_cudnn_refuses_is_named(arrays, opts, message):
    with pytest.raises(ValueError, match=message):
        jax_nn.check_cudnn(*arrays, opts, max_head_dim=128)


def test_what_cudnn_takes_passes_the_check():
    jax_nn.check_cudnn(*grouped(jnp.float16), options(window=(4, 0)), max_head_dim=128)
    jax_nn.check_cudnn(*grouped(d=256), options(window=(4, 3), is_causal=True), max_head_dim=256)
    mixed = grouped()[:2] + (np.zeros((2, 2, 16, 64), np.float16),)
    with pytest.raises(ValueError, match="dtype is bfloat16, float16"):
        jax_nn.check_cudnn(*mixed, options(), max_head_dim=128)


def public_inputs(kv_heads, lq=64, lk=64, seed=0):
    rng = np.random.default_rng(seed)
    shapes = ((2, lq, 8, 64), (2, lk, kv_heads, 64), (2, lk, kv_heads, 64))
    return [jnp.asarray(rng.standard_normal(s), jnp.bfloat16) for s in shapes]


CASES = {
    "plain": dict(),
    "causal": dict(is_causal=True),
    "padding-mask": dict(mask="padding"),
    "full-mask-and-bias": dict(mask="full", bias=True),
    "causal-window": dict(is_causal=True, local_window_size=(8, 0)),
}


def case_kwargs(case, lq, lk):
    kw = dict(CASES[case])
    rng = np.random.default_rng(7)
    if kw.get("mask") == "padding":
        kw["mask"] = jnp.asarray(np.arange(lk)[None, None, None, :] < np.array([lk, lk - 9])[:, None, None, None])
    elif kw.get("mask") == "full":
        kw["mask"] = jnp.asarray(rng.random((2, 8, lq, lk)) > 0.2)
    if kw.pop("bias", False):
        kw["bias"] = jnp.asarray(rng.standard_normal((2, 1, lq, lk)), jnp.bfloat16)
    return kw


@gpu_only
@pytest.mark.parametrize("kv_heads", [8, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("case", list(CASES))
def test_cudnn_matches_vmap_forward_and_backward(case, kv_heads):
    q, k, v = public_inputs(kv_heads)
    kw = case_kwargs(case, 64, 64)
    cotangent = jnp.asarray(np.random.default_rng(3).standard_normal(q.shape), jnp.float32)

    def loss(impl, dtype):
        def f(q, k, v):
            extra = {n: (x.astype(dtype) if n == "bias" else x) for n, x in kw.items()}
            out = attention.dot_product_attention(q, k, v, impl=impl, **extra)
            return jnp.sum(out.astype(jnp.float32) * cotangent), out

        return f

    with jax.default_matmul_precision("highest"):
        (_, want), want_grads = jax.value_and_grad(loss("vmap", jnp.float32), argnums=(0, 1, 2), has_aux=True)(
            *(x.astype(jnp.float32) for x in (q, k, v))
        )
    (_, got), got_grads = jax.value_and_grad(loss("cudnn", jnp.bfloat16), argnums=(0, 1, 2), has_aux=True)(q, k, v)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=BF16_ATOL, rtol=BF16_ATOL)
    for name, g, w in zip("qkv", got_grads, want_grads):
        scale = float(jnp.max(jnp.abs(w)))
        err = float(jnp.max(jnp.abs(g.astype(jnp.float32) - w)))
        assert err <= BF16_ATOL * max(scale, 1.0), (name, err, scale)


@gpu_only
def test_cudnn_decode_step_matches_vmap():
    """One query over a padded cache: Lq = 1 (odd) with a key mask, the decode step's shape."""
    q, k, v = public_inputs(2, lq=1, lk=64)
    mask = jnp.asarray(np.arange(64)[None, None, None, :] < np.array([40, 64])[:, None, None, None])
    got = attention.dot_product_attention(q, k, v, mask=mask, impl="cudnn")
    with jax.default_matmul_precision("highest"):
        want = attention.dot_product_attention(*(x.astype(jnp.float32) for x in (q, k, v)), mask=mask, impl="vmap")
    np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=BF16_ATOL, rtol=BF16_ATOL)


@gpu_only
def test_cudnn_refuses_float32_by_name_on_the_gpu():
    q, k, v = (x.astype(jnp.float32) for x in public_inputs(8))
    with pytest.raises(ValueError, match=r"impl='cudnn': query/key/value dtype is float32"):
        attention.dot_product_attention(q, k, v, impl="cudnn")
