"""α-entmax attention against NumPy (sparsemax in closed form, bisection from the definition), its α → 1 limit,
its gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference
from attention.family.entmax import Entmax, entmax

RNG = np.random.default_rng(0)


def numpy_sparsemax(z):
    """Martins & Astudillo 2016: sort, find the support size k(z), τ = (Σ_{top k} z − 1) / k."""
    z_sorted = -np.sort(-z, axis=-1)
    k = np.arange(1, z.shape[-1] + 1)
    cumsum = np.cumsum(z_sorted, axis=-1)
    support = 1 + k * z_sorted > cumsum
    k_z = support.sum(axis=-1, keepdims=True)
    tau = (np.take_along_axis(cumsum, k_z - 1, axis=-1) - 1) / k_z
    return np.maximum(z - tau, 0)


def numpy_entmax(z, alpha):
    """p_j = [(α−1) z_j − τ]_+^{1/(α−1)}, Σ p = 1: τ by 200 float64 bisection steps."""
    x = (alpha - 1) * np.asarray(z, np.float64)
    lo, hi = x.max(-1, keepdims=True) - 1, x.max(-1, keepdims=True)
    for _ in range(200):
        mid = (lo + hi) / 2
        total = (np.maximum(x - mid, 0) ** (1 / (alpha - 1))).sum(-1, keepdims=True)
        lo, hi = np.where(total >= 1, mid, lo), np.where(total >= 1, hi, mid)
    return np.maximum(x - lo, 0) ** (1 / (alpha - 1))


def test_alpha_two_is_sparsemax():
    z = RNG.normal(size=(3, 4, 9)) * 2
    p = entmax(jnp.asarray(z, jnp.float32), jnp.full((3, 4, 1), 2.0))
    np.testing.assert_allclose(p, numpy_sparsemax(z), atol=1e-5)
    assert (np.asarray(p) == 0).any()


@pytest.mark.parametrize("alpha", [1.25, 1.5, 1.8])
def test_matches_numpy_bisection(alpha):
    z = RNG.normal(size=(5, 7)) * 3
    p = entmax(jnp.asarray(z, jnp.float32), jnp.full((5, 1), alpha))
    np.testing.assert_allclose(p, numpy_entmax(z, alpha), atol=2e-5)


def test_alpha_near_one_is_softmax():
    z = RNG.normal(size=(4, 10))
    p = entmax(jnp.asarray(z, jnp.float32), jnp.full((4, 1), 1.001))
    np.testing.assert_allclose(p, reference.softmax(z), atol=3e-3)


def test_gradients_match_finite_differences_of_numpy():
    z, alpha, w = RNG.normal(size=(2, 6)), 1.6, RNG.normal(size=(2, 6))
    f = lambda z, a: (entmax(z, a) * w).sum()
    dz, da = jax.grad(f, argnums=(0, 1))(jnp.asarray(z, jnp.float32), jnp.full((2, 1), alpha, jnp.float32))
    eps = 1e-5
    num_dz = np.zeros_like(z)
    for idx in np.ndindex(z.shape):
        step = np.zeros_like(z)
        step[idx] = eps
        num_dz[idx] = ((numpy_entmax(z + step, alpha) - numpy_entmax(z - step, alpha)) * w).sum() / (2 * eps)
    num_da = ((numpy_entmax(z, alpha + eps) - numpy_entmax(z, alpha - eps)) * w).sum(-1) / (2 * eps)
    np.testing.assert_allclose(dz, num_dz, atol=2e-4)
    np.testing.assert_allclose(np.asarray(da)[:, 0], num_da, atol=2e-4)


def test_layer_member_matches_numpy_with_gqa_mask_and_causal():
    B, L, H, G, d = 2, 6, 4, 2, 8
    q, k, v = (jnp.asarray(RNG.normal(size=s), jnp.float32) for s in ((B, L, H, d), (B, L, G, d), (B, L, G, d)))
    keep = np.ones((B, 1, 1, L), bool)
    keep[1, ..., 4:] = False
    module = Entmax()
    params = {"params": {"alpha_logit": jnp.array([-1.0, 0.0, 1.0, 3.0])}}
    out = module.apply(params, q, k, v, mask=jnp.asarray(keep), is_causal=True)
    alpha = 1 + 1 / (1 + np.exp(-np.array([-1.0, 0.0, 1.0, 3.0])))
    logits = np.einsum("bqhd,bkhd->bhqk", q, np.repeat(k, 2, axis=2)) / np.sqrt(d)
    allowed = keep & np.tril(np.ones((L, L), bool))
    logits = np.where(allowed, logits, -np.inf)
    p = np.stack([numpy_entmax(logits[:, h], alpha[h]) for h in range(H)], axis=1)
    expected = np.einsum("bhqk,bkhd->bqhd", p, np.repeat(v, 2, axis=2))
    np.testing.assert_allclose(out, expected, atol=2e-5)


def test_gradients_are_causal_and_reach_alpha():
    q, k, v = (jnp.asarray(RNG.normal(size=(1, 7, 2, 4)), jnp.float32) for _ in range(3))
    module = Entmax()
    params = module.init(jax.random.key(0), q, k, v)
    loss = lambda p, q, k, v: module.apply(p, q, k, v, is_causal=True)[0, 3].sum()
    dp, *grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(params, q, k, v)
    for g in grads:
        assert np.all(np.asarray(g)[0, 4:] == 0)
    assert np.all(np.isfinite(dp["params"]["alpha_logit"])) and np.any(dp["params"]["alpha_logit"] != 0)
