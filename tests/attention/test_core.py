"""`attention.dot_product_attention` against a float64 NumPy reference, for every impl."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention
import reference

COMPUTED_IMPLS = ("vmap", "einsum", "xla", "blockwise")  # cudnn needs a GPU; auto is one of these


def random_qkv(batch=(2,), lq=5, lk=7, heads=4, kv_heads=2, dk=8, dv=8, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((*batch, lq, heads, dk)).astype(np.float32)
    k = rng.standard_normal((*batch, lk, kv_heads, dk)).astype(np.float32)
    v = rng.standard_normal((*batch, lk, kv_heads, dv)).astype(np.float32)
    return q, k, v


@pytest.mark.parametrize("impl", COMPUTED_IMPLS)
@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_matches_numpy_with_repeated_kv(impl, kv_heads):
    q, k, v = random_qkv(kv_heads=kv_heads)
    rng = np.random.default_rng(1)
    mask = rng.random((2, 4, 5, 7)) > 0.3
    bias = rng.standard_normal((2, 1, 5, 7)).astype(np.float32)
    out = attention.dot_product_attention(q, k, v, mask=mask, bias=bias, impl=impl)
    expected, _ = reference.attention(q, k, v, mask=mask, bias=bias)
    np.testing.assert_allclose(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", COMPUTED_IMPLS)
@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_heads_first_keys_and_values_match_numpy(impl, kv_heads):
    """kv_layout="BNTH": K/V `[batch..., G, Lk, D]` (the decode cache's layout) give the same attention."""
    q, k, v = random_qkv(batch=(2, 3), kv_heads=kv_heads, dv=6 if impl != "xla" else 8)
    mask = np.random.default_rng(1).random((2, 3, 4, 5, 7)) > 0.3
    out, weights = attention.attend(q, k.swapaxes(-3, -2), v.swapaxes(-3, -2), mask=mask, impl=impl, kv_layout="BNTH")
    expected, expected_weights = reference.attention(q, k, v, mask=mask)
    np.testing.assert_allclose(out, expected, atol=1e-5, rtol=1e-5)
    if weights is not None:
        np.testing.assert_allclose(weights, expected_weights, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", ["vmap", "einsum"])
@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_returned_weights_match_numpy(impl, kv_heads):
    q, k, v = random_qkv(kv_heads=kv_heads)
    mask = np.random.default_rng(5).random((2, 4, 1, 7)) > 0.4
    out, weights = attention.attend(q, k, v, mask=mask, impl=impl)
    expected_out, expected_weights = reference.attention(q, k, v, mask=mask)
    assert weights.shape == (2, 4, 5, 7)
    np.testing.assert_allclose(weights, expected_weights, atol=1e-6)
    np.testing.assert_allclose(out, expected_out, atol=1e-5)


@pytest.mark.parametrize("impl", ["vmap", "einsum"])
def test_value_dim_may_differ_and_several_batch_axes(impl):
    q, k, v = random_qkv(batch=(2, 3), dv=3)
    mask = np.random.default_rng(2).random((3, 1, 5, 7)) > 0.5  # broadcasts over the first batch axis
    out = attention.dot_product_attention(q, k, v, mask=mask, impl=impl)
    assert out.shape == (2, 3, 5, 4, 3)
    np.testing.assert_allclose(out, reference.attention(q, k, v, mask=mask)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", COMPUTED_IMPLS)
@pytest.mark.parametrize("window", [None, 2, (1, 0)])
def test_causal_and_window_flags_match_explicit_masks(impl, window):
    q, k, v = random_qkv(lq=6, lk=6)
    i, j = np.arange(6)[:, None], np.arange(6)[None, :]
    left, right = (window, window) if isinstance(window, int) else (window or (6, 6))
    expected_mask = (j <= i) & (j >= i - left) & (j <= i + right)
    out = jax.jit(
        lambda q, k, v: attention.dot_product_attention(q, k, v, is_causal=True, local_window_size=window, impl=impl)
    )(q, k, v)
    np.testing.assert_allclose(out, reference.attention(q, k, v, mask=expected_mask)[0], atol=1e-5)


@pytest.mark.parametrize("impl", COMPUTED_IMPLS)
def test_fully_masked_row_is_the_mean_of_values(impl):
    q, k, v = random_qkv()
    mask = np.ones((2, 1, 5, 7), bool)
    mask[:, :, 3, :] = False
    out = attention.dot_product_attention(q, k, v, mask=mask, impl=impl)
    assert np.all(np.isfinite(out))
    mean_v = np.repeat(v.mean(axis=1), 2, axis=1)  # [B, H, Dv], KV head h // 2
    np.testing.assert_allclose(out[:, 3], mean_v, atol=1e-5)


def test_causal_output_ignores_the_future():
    """d out_i / d x_j == 0 for j > i, through the gradient (all inputs depend on x)."""
    q, k, v = random_qkv(batch=(1,), lq=6, lk=6)

    def output_row(x, i, impl):
        out = attention.dot_product_attention(x * q, x * k, x * v, is_causal=True, impl=impl)
        return out[0, i].sum()

    x = jnp.ones((1, 6, 1, 1))
    for impl in ("vmap", "einsum"):
        for i in range(6):
            grad = jax.grad(output_row)(x, i, impl)[0, :, 0, 0]
            assert np.all(grad[i + 1 :] == 0), (impl, i, grad)
            assert np.all(grad[: i + 1] != 0), (impl, i, grad)


@pytest.mark.parametrize("impl", ["vmap", "einsum"])
def test_gradients_match_jax_nn(impl):
    q, k, v = random_qkv(kv_heads=2)
    mask = np.random.default_rng(3).random((2, 1, 5, 7)) > 0.2
    cot = np.random.default_rng(4).standard_normal((2, 5, 4, 8)).astype(np.float32)

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v) * cot)

    ours = jax.jit(
        jax.grad(loss(lambda q, k, v: attention.dot_product_attention(q, k, v, mask=mask, impl=impl)), (0, 1, 2))
    )
    theirs = jax.grad(loss(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=jnp.asarray(mask))), (0, 1, 2))
    for a, b in zip(ours(q, k, v), theirs(q, k, v)):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", COMPUTED_IMPLS)
@pytest.mark.parametrize("lq, kv_heads", [(5, 2), (1, 4), (1, 2)], ids=["queries", "one-query-mha", "one-query-gqa"])
def test_bfloat16_inputs_keep_float32_softmax(impl, lq, kv_heads):
    """One query (a decode step) takes its own float32 product-and-sum path in `attention.head`."""
    q, k, v = random_qkv(lq=lq, kv_heads=kv_heads)
    q = q * 30  # large logits: a bfloat16 softmax would be visibly off
    out = attention.dot_product_attention(*(jnp.asarray(x, jnp.bfloat16) for x in (q, k, v)), impl=impl)
    assert out.dtype == jnp.bfloat16
    expected, _ = reference.attention(*(np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32) for x in (q, k, v)))
    np.testing.assert_allclose(np.asarray(out, np.float32), expected, atol=3e-2, rtol=3e-2)
    grads = jax.grad(
        lambda q: (
            attention.dot_product_attention(q, k.astype(jnp.bfloat16), v.astype(jnp.bfloat16), impl=impl)
            .astype(jnp.float32)
            .sum()
        )
    )(q.astype(jnp.bfloat16))
    assert grads.dtype == jnp.bfloat16 and np.all(np.isfinite(np.asarray(grads, np.float32)))


@pytest.mark.parametrize("impl", ["vmap", "einsum"])
@pytest.mark.parametrize("broadcast", [True, False])
def test_dropout_matches_flax_with_the_same_rng(impl, broadcast):
    q, k, v = random_qkv(kv_heads=4)
    rng = jax.random.key(7)
    ours = attention.dot_product_attention(
        q,
        k,
        v,
        impl=impl,
        dropout_rate=0.3,
        dropout_rng=rng,
        deterministic=False,
        broadcast_dropout=broadcast,
    )
    flax_out = nn.dot_product_attention(
        q, k, v, dropout_rate=0.3, dropout_rng=rng, deterministic=False, broadcast_dropout=broadcast
    )
    np.testing.assert_allclose(ours, flax_out, atol=1e-5)
    assert not np.allclose(ours, reference.attention(q, k, v)[0], atol=1e-3)  # dropout did act


def test_precision_is_accepted_by_every_impl():
    q, k, v = random_qkv()
    expected, _ = reference.attention(q, k, v)
    for impl in COMPUTED_IMPLS:
        out = attention.dot_product_attention(q, k, v, impl=impl, precision=jax.lax.Precision.HIGHEST)
        np.testing.assert_allclose(out, expected, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(impl="flash"), "impl must be one of"),
        # float32 inputs: on a GPU cuDNN's dtype refusal, elsewhere the backend's
        (dict(impl="cudnn"), "needs an NVIDIA GPU" if jax.default_backend() != "gpu" else "dtype is float32"),
        (dict(mask=np.ones((2, 3, 5, 7), np.float32)), r"mask has shape \(2, 3, 5, 7\), which does not broadcast"),
        (dict(mask=np.ones((2, 3, 5, 7), bool)), r"does not broadcast to \(2, 4, 5, 7\)"),
        (dict(bias=np.ones((5, 6), np.float32)), "bias has shape"),
        (dict(local_window_size=-1), "local_window_size"),
        (dict(kv_layout="BHTD"), r"kv_layout = 'BHTD'; expected 'BTNH' .* or 'BNTH'"),
        (dict(dropout_rate=1.0), "dropout_rate"),
        (dict(dropout_rate=0.1, deterministic=False), "dropout_rng is required"),
        (
            dict(impl="xla", dropout_rate=0.1, deterministic=False, dropout_rng=jax.random.key(0)),
            "no attention dropout",
        ),
    ],
)
def test_bad_arguments_raise(kwargs, message):
    q, k, v = random_qkv()
    with pytest.raises(ValueError, match=message):
        attention.dot_product_attention(q, k, v, **kwargs)


@pytest.mark.parametrize(
    "shapes, message",
    [
        (((2, 5, 4, 8), (2, 7, 3, 8), (2, 7, 3, 8)), "multiple of key/value heads"),
        (((2, 5, 4, 8), (2, 7, 2, 6), (2, 7, 2, 6)), "head dims differ"),
        (((2, 5, 4, 8), (3, 7, 2, 8), (3, 7, 2, 8)), "batch axes differ"),
        (((5, 4, 8), (2, 7, 2, 8), (2, 7, 2, 8)), "same rank"),
        (((2, 5, 4, 8), (2, 7, 2, 8), (2, 6, 2, 8)), "must agree"),
    ],
)
def test_bad_shapes_raise(shapes, message):
    q, k, v = (np.zeros(s, np.float32) for s in shapes)
    with pytest.raises(ValueError, match=message):
        attention.dot_product_attention(q, k, v)
