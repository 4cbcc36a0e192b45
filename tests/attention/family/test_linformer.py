"""Linformer against NumPy from the paper's eq. 7, its k = N identity limit, and its refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference
from attention.family.linformer import Linformer

RNG = np.random.default_rng(0)


def qkv(B=2, Lq=5, Lk=7, H=4, G=2, d=8):
    return [jnp.asarray(RNG.normal(size=s), jnp.float32) for s in ((B, Lq, H, d), (B, Lk, G, d), (B, Lk, G, d))]


def numpy_linformer(q, k, v, E, F, keep=None):
    """head = softmax(Q (E K)ᵀ / √d) (F V), padded keys zeroed; E, F cut to the Lk columns."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    if keep is not None:
        k, v = k * keep[:, :, None, None], v * keep[:, :, None, None]
    Lk = k.shape[1]
    E, F = np.asarray(E, np.float64)[:, :Lk], np.asarray(F, np.float64)[:, :Lk]
    k_proj, v_proj = np.einsum("kn,bngd->bkgd", E, k), np.einsum("kn,bngd->bkgd", F, v)
    return reference.attention(q, k_proj, v_proj)[0]


@pytest.mark.parametrize("share_kv", [False, True])
def test_matches_numpy_with_key_padding(share_kv):
    q, k, v = qkv()
    keep = np.array([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1]], bool)
    mask = jnp.asarray(keep)[:, None, None, :]
    module = Linformer(max_length=9, projected_length=3, share_kv=share_kv)
    params = module.init(jax.random.key(0), q, k, v, mask=mask)
    out = module.apply(params, q, k, v, mask=mask)
    E = params["params"]["E"]
    F = E if share_kv else params["params"]["F"]
    assert set(params["params"]) == ({"E"} if share_kv else {"E", "F"})
    np.testing.assert_allclose(out, numpy_linformer(q, k, v, E, F, keep), rtol=1e-5, atol=1e-5)


def test_k_equal_n_with_identity_projections_is_exact_attention():
    q, k, v = qkv(Lk=6)
    module = Linformer(max_length=6, projected_length=6)
    eye = jnp.eye(6)
    out = module.apply({"params": {"E": eye, "F": eye}}, q, k, v)
    np.testing.assert_allclose(out, reference.attention(q, k, v)[0], rtol=1e-5, atol=1e-5)


def test_pooling_init_averages_consecutive_windows():
    q, k, v = qkv(Lk=7)
    E = Linformer(max_length=7, projected_length=3, projection_init="pooling").init(jax.random.key(0), q, k, v)[
        "params"
    ]["E"]
    third, half = 1 / 3, 1 / 2  # ⌊j·3/7⌋ for j = 0..6: 0 0 0 1 1 2 2
    expected = [[third, third, third, 0, 0, 0, 0], [0, 0, 0, half, half, 0, 0], [0, 0, 0, 0, 0, half, half]]
    np.testing.assert_allclose(E, expected, rtol=1e-6)


def test_pooling_init_at_k_equal_n_starts_as_exact_attention():
    q, k, v = qkv(Lk=6)
    module = Linformer(max_length=6, projected_length=6, projection_init="pooling")
    out = module.apply(module.init(jax.random.key(0), q, k, v), q, k, v)
    np.testing.assert_allclose(out, reference.attention(q, k, v)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs, call, message",
    [
        ({}, dict(is_causal=True), "cannot be causal"),
        (dict(max_length=6), {}, "max_length = 6; the keys have length 7"),
        ({}, dict(mask=jnp.ones((1, 1, 5, 7), bool)), "key-padding masks"),
        (dict(projected_length=0), {}, "projected_length = 0"),
        (dict(projection_init="identity"), {}, "projection_init = 'identity'"),
    ],
)
def test_bad_settings_raise_naming_the_field(kwargs, call, message):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=message):
        Linformer(**kwargs).init(jax.random.key(0), q, k, v, **call)
