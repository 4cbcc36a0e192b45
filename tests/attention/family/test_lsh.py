"""Reformer LSH attention against NumPy (hash, sort, chunk, combine rounds), its one-bucket limit, causality."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention
import reference
from attention.family.lsh import LSH

RNG = np.random.default_rng(0)
B, L, H, d = 2, 12, 2, 8


def qv():
    return [jnp.asarray(RNG.normal(size=s), jnp.float32) for s in ((B, L, H, d), (B, L, H, d))]


def numpy_lsh(q, v, rotations, chunk, causal, keep, mask_self=True):
    """Per round: buckets argmax([xR; −xR]), stable sort by bucket, chunks see own + previous chunk,
    same bucket only, own key at −1e5; rounds weighted by softmax of their log-sum-exps."""
    q, v, rotations = (np.asarray(x, np.float64) for x in (q, v, rotations))
    out = np.zeros(q.shape[:2] + (H, v.shape[-1]))
    n_hashes = rotations.shape[1]
    for b in range(B):
        for h in range(H):
            x = q[b, :, h]
            k = x / np.linalg.norm(x, axis=-1, keepdims=True)
            outs, lses = [], []
            for r in range(n_hashes):
                rot = k @ rotations[:, r]
                bucket = np.argmax(np.concatenate([rot, -rot], -1), -1)
                order = np.lexsort((np.arange(L), bucket))
                n = L // chunk
                o, lse = np.zeros((L, v.shape[-1])), np.zeros(L)
                for c in range(n):
                    rows = order[c * chunk : (c + 1) * chunk]
                    cols = (
                        rows
                        if n == 1
                        else np.concatenate([order[((c - 1) % n) * chunk : ((c - 1) % n + 1) * chunk], rows])
                    )
                    s = x[rows] @ k[cols].T / np.sqrt(d)
                    ok = (bucket[rows][:, None] == bucket[cols][None]) & keep[b, cols][None]
                    if causal:
                        ok &= cols[None] <= rows[:, None]
                    s = np.where(ok, s, -1e9)
                    if mask_self:
                        s = np.where(cols[None] == rows[:, None], np.minimum(s, -1e5), s)
                    m = s.max(-1, keepdims=True)
                    lse[rows] = (m + np.log(np.exp(s - m).sum(-1, keepdims=True)))[:, 0]
                    o[rows] = np.exp(s - lse[rows][:, None]) @ v[b, cols, h]
                outs.append(o)
                lses.append(lse)
            w = np.exp(np.array(lses) - np.array(lses).max(0))
            w = w / w.sum(0)
            out[b, :, h] = (w[..., None] * np.array(outs)).sum(0)
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_matches_numpy_with_padding(causal):
    q, v = qv()
    keep = np.ones((B, L), bool)
    keep[1, 9:] = False
    module = LSH(num_buckets=4, chunk_length=4, num_hashes=2)
    params = module.init(jax.random.key(0), q, q, v)
    out = module.apply(params, q, q, v, mask=jnp.asarray(keep)[:, None, None], is_causal=causal)
    expected = numpy_lsh(q, v, params["params"]["rotations"], 4, causal, keep)
    np.testing.assert_allclose(out, expected, atol=2e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_one_bucket_one_chunk_is_exact_shared_qk_attention(causal):
    q, v = qv()
    module = LSH(num_buckets=1, chunk_length=L, num_hashes=1, mask_self=False)
    out = module.apply(module.init(jax.random.key(0), q, q, v), q, q, v, is_causal=causal)
    keys = np.asarray(q) / np.linalg.norm(q, axis=-1, keepdims=True)
    mask = np.tril(np.ones((L, L), bool)) if causal else None
    np.testing.assert_allclose(out, reference.attention(q, keys, v, mask=mask)[0], atol=2e-5)


def test_gradients_are_causal():
    q, v = qv()
    module = LSH(num_buckets=2, chunk_length=4)
    params = module.init(jax.random.key(0), q, q, v)
    loss = lambda q, v: module.apply(params, q, q, v, is_causal=True)[:, 5].sum()
    for g in jax.jit(jax.grad(loss, argnums=(0, 1)))(q, v):
        assert np.all(np.asarray(g)[:, 6:] == 0)


def test_layer_shares_query_and_key_and_refuses_cross_attention():
    x = jnp.asarray(RNG.normal(size=(B, L, 16)), jnp.float32)
    layer = attention.MultiHeadAttention(num_heads=2, attention_type="lsh", attention_options={"chunk_length": 4})
    assert set(layer.init(jax.random.key(0), x)["params"]) == {"query", "value", "out", "lsh"}
    with pytest.raises(ValueError, match="inputs_k with attention_type='lsh'"):
        layer.init(jax.random.key(0), x, x[:, :5])
    with pytest.raises(ValueError, match="lsh num_buckets = 3"):
        LSH(num_buckets=3).init(jax.random.key(0), *qv()[:1], *qv())
