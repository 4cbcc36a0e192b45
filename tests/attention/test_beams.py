"""Beam histories read in place (attention.beams) against NumPy attention over each beam's gathered keys."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention import MultiHeadAttention, beams

RNG = np.random.default_rng(0)


def numpy_history_attention(query, key, value, beam_rows, mask, bias=None):
    """Per beam: its keys/values gathered position by position, then softmax(q kᵀ/√d + bias) v in float64."""
    B, K, L = beam_rows.shape
    q, k, v = (np.asarray(x, np.float64) for x in (query, key, value))
    H, G = q.shape[2], k.shape[2]
    out = np.zeros((B * K, q.shape[1], H, v.shape[-1]))
    for b in range(B):
        for beam in range(K):
            rows = b * K + beam_rows[b, beam]
            k_hist, v_hist = k[rows, np.arange(L)], v[rows, np.arange(L)]  # [L, G, D]
            for h in range(H):
                g = h // (H // G)
                logits = q[b * K + beam, :, h] @ k_hist[:, g].T / np.sqrt(q.shape[-1])
                if bias is not None:
                    logits = logits + np.broadcast_to(bias, mask.shape)[b * K + beam, h]
                logits = np.where(mask[b * K + beam, h], logits, -np.inf)
                weights = np.exp(logits - logits.max(-1, keepdims=True))
                out[b * K + beam, :, h] = (weights / weights.sum(-1, keepdims=True)) @ v_hist[:, g]
    return out


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("H, G, Lq", [(4, 4, 1), (4, 2, 1), (2, 1, 2)])
def test_history_attention_matches_numpy_over_gathered_histories(H, G, Lq, with_bias):
    B, K, L, D = 3, 4, 7, 8
    filled = 5  # positions 0..4 written; the queries are the last Lq of them
    query = RNG.normal(size=(B * K, Lq, H, D)).astype(np.float32)
    key, value = (RNG.normal(size=(B * K, L, G, D)).astype(np.float32) for _ in range(2))
    beam_rows = RNG.integers(0, K, size=(B, K, L)).astype(np.int32)
    positions = filled - Lq + np.arange(Lq)
    mask = np.broadcast_to(np.arange(L)[None, :] <= positions[:, None], (B * K, H, Lq, L)).copy()
    mask[1, 0, -1, 2] = False  # a caller's mask entry, honoured too
    # a bias per head, query and position (as span's log soft mask), shared by the rows: [1, H, Lq, L]
    bias = RNG.normal(size=(1, H, Lq, L)).astype(np.float32) if with_bias else None
    heads_first = lambda x: jnp.asarray(x.transpose(0, 2, 1, 3))  # the cache's layout, as attention reads it
    out = beams.history_attention(
        jnp.asarray(query),
        heads_first(key),
        heads_first(value),
        jnp.asarray(beam_rows),
        jnp.asarray(mask),
        bias=None if bias is None else jnp.asarray(bias),
    )
    assert out.shape == (B * K, Lq, H, D)
    np.testing.assert_allclose(
        out, numpy_history_attention(query, key, value, beam_rows, mask, bias), rtol=2e-5, atol=2e-6
    )


def test_gather_history_takes_each_position_from_its_row():
    B, K, G, L, D = 2, 3, 2, 5, 2
    x = np.arange(B * K * G * L * D, dtype=np.float32).reshape(B * K, G, L, D)  # a cache, heads first
    beam_rows = RNG.integers(0, K, size=(B, K, L)).astype(np.int32)
    expected = np.empty_like(x)
    for b, k, p in np.ndindex(B, K, L):
        expected[b * K + k, :, p] = x[b * K + beam_rows[b, k, p], :, p]
    np.testing.assert_array_equal(beams.gather_history(jnp.asarray(x), jnp.asarray(beam_rows)), expected)


def test_a_beam_table_that_does_not_fit_the_cache_raises():
    layer = MultiHeadAttention(num_heads=2, qkv_features=8, decode=True)
    x = jnp.ones((6, 4, 8))
    cache = layer.init(jax.random.key(0), x)["cache"]
    params = layer.init(jax.random.key(0), x)["params"]
    bad = {**cache, "beam_rows": jnp.zeros((2, 2, 4), jnp.int32)}  # 2 x 2 beams, but the batch is 6
    with pytest.raises(ValueError, match="beam_rows must be"):
        layer.apply({"params": params, "cache": bad}, x[:, :1], mutable=["cache"])
