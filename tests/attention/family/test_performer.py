"""Performer (FAVOR+) against NumPy from the paper's feature map, its convergence to softmax, its decode state."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference
from attention.family.performer import Performer, _normalise, orthogonal_features

RNG = np.random.default_rng(0)


def qkv(B=2, L=9, H=4, G=2, d=8, scale=0.5):
    return [jnp.asarray(scale * RNG.normal(size=s), jnp.float32) for s in ((B, L, H, d), (B, L, G, d), (B, L, G, d))]


def numpy_favor(q, k, v, w, causal, keep=None):
    """φ(x) = exp(Wx − |x|²/2)/√m on x = q/d^¼, k/d^¼; out_i = Σ_j φ(q_i)·φ(k_j) v_j / Σ_j φ(q_i)·φ(k_j)."""
    q, k, v, w = (np.asarray(x, np.float64) for x in (q, k, v, w))
    d, m = q.shape[-1], w.shape[0]
    phi = lambda x: np.exp(x @ w.T - 0.5 * (x * x).sum(-1, keepdims=True)) / np.sqrt(m)
    pq, pk = phi(q / d**0.25), phi(k / d**0.25)
    repeat = q.shape[2] // k.shape[2]
    pk, v = np.repeat(pk, repeat, axis=2), np.repeat(v, repeat, axis=2)
    scores = np.einsum("bqhm,bkhm->bhqk", pq, pk)  # the kernel estimate of exp(q·k/√d)
    if keep is not None:
        scores = scores * keep[:, None, None, :]
    if causal:
        scores = scores * np.tril(np.ones(scores.shape[-2:]))
    return np.einsum("bhqk,bkhd->bqhd", scores, v) / scores.sum(-1)[..., None].transpose(0, 2, 1, 3)


@pytest.mark.parametrize("causal, chunk", [(False, 4), (True, 4), (True, 3), (True, 64)])
def test_matches_numpy_favor(causal, chunk):
    q, k, v = qkv()
    module = Performer(num_features=16, chunk_length=chunk)
    params = module.init(jax.random.key(0), q, k, v)
    out = module.apply(params, q, k, v, is_causal=causal)
    expected = numpy_favor(q, k, v, params["params"]["random_features"], causal)
    np.testing.assert_allclose(out, expected, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_keys_far_from_every_feature_keep_their_weights_and_finite_gradients(causal):
    """Keys moved ~30 away from the origin: exp(−|y − w|²/2) underflows float32 for every feature (the
    denominator was 0 and, a little closer, its gradient overflowed: the NaN of the Multi30k run)."""
    q, k, v = qkv()
    k = k + 30 / np.sqrt(k.shape[-1])
    module = Performer(num_features=16, chunk_length=4)
    params = module.init(jax.random.key(0), q, k, v)
    out = module.apply(params, q, k, v, is_causal=causal)
    np.testing.assert_allclose(
        out, numpy_favor(q, k, v, params["params"]["random_features"], causal), rtol=2e-4, atol=2e-5
    )
    grads = jax.grad(lambda q, k, v: module.apply(params, q, k, v, is_causal=causal).sum(), argnums=(0, 1, 2))(q, k, v)
    assert all(np.isfinite(np.asarray(g)).all() for g in grads)


def test_normalise_gradient_does_not_square_a_small_denominator():
    """d(n/d)/dd = −(n/d)/d by hand: with n = 3d and d = 1e-25 it is −3e25; 1/d² (= 1e50) would overflow."""
    den = jnp.asarray([1e-25], jnp.float32)
    num = 3.0 * den[:, None]
    out, tangent = jax.jvp(_normalise, (num, den), (jnp.zeros_like(num), jnp.ones_like(den)))
    np.testing.assert_allclose(out, [[3.0]], rtol=1e-6)
    np.testing.assert_allclose(tangent, [[-3e25]], rtol=1e-6)


def test_key_padding_zeroes_the_padded_keys_features():
    q, k, v = qkv()
    keep = np.ones((2, 9), bool)
    keep[0, 6:] = False
    module = Performer(num_features=16)
    params = module.init(jax.random.key(0), q, k, v)
    out = module.apply(params, q, k, v, mask=jnp.asarray(keep)[:, None, None, :])
    np.testing.assert_allclose(
        out, numpy_favor(q, k, v, params["params"]["random_features"], False, keep), rtol=2e-4, atol=2e-5
    )


def test_features_are_orthogonal_in_blocks_with_gaussian_norms():
    w = np.asarray(orthogonal_features(jax.random.key(3), 20, 8), np.float64)
    for block in (w[:8], w[8:16]):
        unit = block / np.linalg.norm(block, axis=1, keepdims=True)
        np.testing.assert_allclose(unit @ unit.T, np.eye(8), atol=1e-5)
    assert 1.0 < np.linalg.norm(w, axis=1).mean() < 5.0  # chi(8) has mean ~2.7


@pytest.mark.parametrize("causal", [False, True])
def test_error_against_softmax_shrinks_as_features_grow(causal):
    q, k, v = qkv(B=1, L=16, H=2, G=2, d=8, scale=0.6)
    mask = np.tril(np.ones((16, 16), bool)) if causal else None
    exact = reference.attention(q, k, v, mask=mask)[0]
    errors = []
    for m in (8, 128, 4096):
        module = Performer(num_features=m)
        run = jax.jit(lambda rng: module.apply(module.init(rng, q, k, v), q, k, v, is_causal=causal))
        errors.append(np.mean([np.abs(np.asarray(run(jax.random.key(seed))) - exact).mean() for seed in range(3)]))
    assert errors[0] > errors[1] > errors[2], errors
    assert errors[2] < 0.02, errors


def test_gradients_are_causal():
    q, k, v = qkv(B=1, L=8)
    module = Performer(num_features=16, chunk_length=3)
    params = module.init(jax.random.key(0), q, k, v)
    loss = lambda q, k, v: module.apply(params, q, k, v, is_causal=True)[0, 4].sum()
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    for g in grads:
        assert np.all(np.asarray(g)[0, 5:] == 0) and np.any(np.asarray(g)[0, :5] != 0)


def test_decode_state_continues_the_causal_pass_and_does_not_grow():
    q, k, v = qkv(B=2, L=8)
    module = Performer(num_features=16, chunk_length=3, decode=True)
    variables = module.init(jax.random.key(0), q, k, v)
    state_shapes = jax.tree.map(jnp.shape, variables["cache"])
    full = Performer(num_features=16, chunk_length=3).apply({"params": variables["params"]}, q, k, v, is_causal=True)
    pieces, cache = [], variables["cache"]
    for lo, hi in ((0, 3), (3, 4), (4, 5), (5, 8)):
        out, updated = module.apply(
            {"params": variables["params"], "cache": cache}, q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], mutable=["cache"]
        )
        cache = updated["cache"]
        pieces.append(out)
        assert jax.tree.map(jnp.shape, cache) == state_shapes  # [B, G, m, d_v] and [B, G, m]
    np.testing.assert_allclose(jnp.concatenate(pieces, axis=1), full, rtol=1e-5, atol=1e-6)
    assert state_shapes == {"state_kv": (2, 2, 16, 8), "state_z": (2, 2, 16), "state_shift": (2, 2, 16)}


def test_query_dependent_mask_raises():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="key-padding masks"):
        Performer().init(jax.random.key(0), q, k, v, mask=jnp.ones((2, 1, 9, 9), bool))
