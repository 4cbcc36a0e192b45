"""Adaptive span against NumPy from the paper's soft mask, its full-span limit, its decode over the cache."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention
import reference
from attention.family.span import Span
from chunked import decode_in_chunks

RNG = np.random.default_rng(0)
B, L, H, G, d = 2, 10, 4, 2, 8


def qkv():
    return [jnp.asarray(RNG.normal(size=s), jnp.float32) for s in ((B, L, H, d), (B, L, G, d), (B, L, G, d))]


def numpy_span(q, k, v, z, ramp, causal):
    """a_ij = m_z(i−j) exp(s_ij) / Σ_k m_z(i−k) exp(s_ik), m_z(x) = clip((R + z − x)/R, 0, 1)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    k, v = np.repeat(k, H // G, axis=2), np.repeat(v, H // G, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d)
    x = np.arange(L)[:, None] - np.arange(L)[None, :]
    x = x if causal else np.abs(x)
    m = np.clip((ramp + np.asarray(z)[:, None, None] - x) / ramp, 0, 1)
    if causal:
        m = m * (x >= 0)
    w = m * np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhqk,bkhd->bqhd", w / w.sum(-1, keepdims=True), v)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("impl", ["vmap", "blockwise"])
def test_matches_numpy(causal, impl):
    q, k, v = qkv()
    fraction = jnp.array([0.0, 0.25, 0.5, 1.0])
    out = Span(max_span=8, ramp=3, impl=impl).apply({"params": {"span": fraction}}, q, k, v, is_causal=causal)
    np.testing.assert_allclose(out, numpy_span(q, k, v, 8 * np.asarray(fraction), 3, causal), atol=2e-5)


def test_full_span_is_exact_attention():
    q, k, v = qkv()
    module = Span(max_span=L, ramp=2)
    params = module.init(jax.random.key(0), q, k, v)
    mask = np.tril(np.ones((L, L), bool))
    np.testing.assert_allclose(
        module.apply(params, q, k, v, is_causal=True), reference.attention(q, k, v, mask=mask)[0], atol=2e-5
    )


def test_gradients_are_causal_and_reach_the_span():
    q, k, v = qkv()
    module = Span(max_span=4, ramp=2)
    params = {"params": {"span": jnp.full((H,), 0.5)}}
    loss = lambda p, q, k, v: module.apply(p, q, k, v, is_causal=True)[:, 6].sum()
    dp, *grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(params, q, k, v)
    for g in grads:
        assert np.all(np.asarray(g)[:, 7:] == 0)
    assert np.all(np.asarray(dp["params"]["span"]) != 0)


def test_layer_decode_equals_the_full_pass():
    x = jnp.asarray(RNG.normal(size=(B, L, 16)), jnp.float32)
    options = dict(max_span=4, ramp=2, span_init=0.5)
    layer = attention.MultiHeadAttention(
        num_heads=4, num_kv_heads=2, attention_type="span", attention_options=options, decode=True
    )
    variables = layer.init(jax.random.key(0), x)
    full = layer.clone(decode=False).apply({"params": variables["params"]}, x, is_causal=True)
    np.testing.assert_allclose(decode_in_chunks(layer, variables, x, ((0, 4), (4, 5), (5, 10))), full, atol=2e-5)


def test_a_negative_l1_penalty_is_refused_by_name():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="span l1_penalty = -0.1; expected a float >= 0"):
        Span(l1_penalty=-0.1).init(jax.random.key(0), q, k, v)
