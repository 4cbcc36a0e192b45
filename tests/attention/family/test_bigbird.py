"""BigBird: its block pattern, NumPy attention under that pattern, the all-window limit, causality."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference
from attention.family.bigbird import BigBird, block_pairs

RNG = np.random.default_rng(0)


def qkv(B=2, L=22, H=4, G=2, d=8):
    return [jnp.asarray(RNG.normal(size=s), jnp.float32) for s in ((B, L, H, d), (B, L, G, d), (B, L, G, d))]


def dense_mask(pairs, L, b):
    blocks = np.zeros((-(-L // b),) * 2, bool)
    blocks[pairs[:, 0], pairs[:, 1]] = True
    return np.kron(blocks, np.ones((b, b), bool))[:L, :L]


@pytest.mark.parametrize("causal", [False, True])
def test_pattern_has_window_global_and_random_blocks(causal):
    n, w, g, r = 12, 1, 2, 3
    blocks = np.zeros((n, n), bool)
    pairs = block_pairs(n, w, g, r, seed=5, is_causal=causal)
    blocks[pairs[:, 0], pairs[:, 1]] = True
    i, j = np.indices((n, n))
    allowed = (j <= i) if causal else np.ones((n, n), bool)
    structural = allowed & ((abs(i - j) <= w) | (i < g) | (j < g))
    assert np.all(blocks[structural]) and not np.any(blocks & ~allowed)
    extra = (blocks & ~structural).sum(axis=1)
    assert np.all(extra == np.minimum(r, (allowed & ~structural).sum(axis=1)))


@pytest.mark.parametrize("causal", [False, True])
def test_matches_numpy_attention_under_the_pattern_with_padding(causal):
    q, k, v = qkv()
    keep = np.ones((2, 1, 1, 22), bool)
    keep[0, ..., 18:] = False
    module = BigBird(block_size=4, window_blocks=1, global_blocks=1, random_blocks=1, seed=3)
    out = module.apply({}, q, k, v, mask=jnp.asarray(keep), is_causal=causal)
    mask = dense_mask(block_pairs(6, 1, 1, 1, 3, causal), 22, 4) & keep
    if causal:
        mask = mask & np.tril(np.ones((22, 22), bool))
    np.testing.assert_allclose(out, reference.attention(q, k, v, mask=mask)[0], atol=2e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_a_window_covering_everything_is_exact_attention(causal):
    q, k, v = qkv()
    out = BigBird(block_size=4, window_blocks=6, global_blocks=0, random_blocks=0).apply({}, q, k, v, is_causal=causal)
    mask = np.tril(np.ones((22, 22), bool)) if causal else None
    np.testing.assert_allclose(out, reference.attention(q, k, v, mask=mask)[0], atol=2e-5)


def test_gradients_are_causal():
    q, k, v = qkv(B=1)
    module = BigBird(block_size=4, random_blocks=1)
    loss = lambda q, k, v: module.apply({}, q, k, v, is_causal=True)[0, 9].sum()
    for g in jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v):
        assert np.all(np.asarray(g)[0, 10:] == 0) and np.any(np.asarray(g)[0, :10] != 0)


def test_bad_settings_raise_naming_the_field():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="bigbird block_size = 0"):
        BigBird(block_size=0).apply({}, q, k, v)
    with pytest.raises(ValueError, match="self-attention"):
        BigBird().apply({}, q, k[:, :5], v[:, :5])
