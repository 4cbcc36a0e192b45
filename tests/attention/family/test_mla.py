"""MLA: the identity-up-projection limit is MHA, decode over the latent cache equals the full pass, cache sizes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention
from attention import family
from attention.geometry import HeadGeometry
from chunked import decode_in_chunks

RNG = np.random.default_rng(0)
B, L, D, H = 2, 7, 16, 4
d = D // H


def x_input(length=L):
    return jnp.asarray(RNG.normal(size=(B, length, D)), jnp.float32)


def test_identity_up_projections_with_a_wide_latent_are_mha():
    x, y = x_input(), x_input(5)
    mha = attention.MultiHeadAttention(num_heads=H)
    params = mha.init(jax.random.key(0), x, y)["params"]
    flat = lambda kernel: kernel.reshape(D, H * d)
    eye = np.eye(2 * H * d, dtype=np.float32)
    mla_params = {
        "out": params["out"],
        "mla": {
            "query": params["query"],
            "kv_down": {
                "kernel": jnp.concatenate([flat(params["key"]["kernel"]), flat(params["value"]["kernel"])], 1),
                "bias": jnp.concatenate([params["key"]["bias"].ravel(), params["value"]["bias"].ravel()]),
            },
            "key_up": eye[:, : H * d].reshape(2 * H * d, H, d),
            "value_up": eye[:, H * d :].reshape(2 * H * d, H, d),
        },
    }
    mla = attention.MultiHeadAttention(num_heads=H, attention_type="mla", attention_options={"latent_dim": 2 * H * d})
    mask = jnp.asarray(RNG.random((B, 1, L, 5)) > 0.3)
    np.testing.assert_allclose(
        mla.apply({"params": mla_params}, x, y, mask=mask), mha.apply({"params": params}, x, y, mask=mask), atol=1e-5
    )
    np.testing.assert_allclose(
        mla.apply({"params": mla_params}, x, is_causal=True),
        mha.apply({"params": params}, x, is_causal=True),
        atol=1e-5,
    )


def test_decode_over_the_latent_cache_equals_the_full_pass():
    x = x_input()
    layer = attention.MultiHeadAttention(
        num_heads=H, attention_type="mla", attention_options={"latent_dim": 6}, decode=True
    )
    variables = layer.init(jax.random.key(0), x)
    assert variables["cache"]["mla"]["cached_latent"].shape == (B, L, 6)
    full = layer.clone(decode=False).apply({"params": variables["params"]}, x, is_causal=True)
    np.testing.assert_allclose(decode_in_chunks(layer, variables, x, ((0, 3), (3, 4), (4, 7))), full, atol=1e-5)


def test_gradients_are_causal():
    x = x_input()
    layer = attention.MultiHeadAttention(num_heads=H, attention_type="mla")
    params = layer.init(jax.random.key(0), x)
    grad = jax.jit(jax.grad(lambda x: layer.apply(params, x, is_causal=True)[:, 3].sum()))(x)
    assert np.all(np.asarray(grad)[:, 4:] == 0) and np.any(np.asarray(grad)[:, :4] != 0)


def test_cache_elements_per_token_mha_gqa_mqa_mla():
    geometry = lambda g: HeadGeometry.resolve(8, num_kv_heads=g, features=512)
    per_token = {
        kind: family.cache_elements_per_token(t, geometry(g), o)
        for kind, t, g, o in (
            ("MHA", "softmax", 8, None),
            ("GQA", "softmax", 2, None),
            ("MQA", "softmax", 1, None),
            ("MLA", "mla", 8, None),
            ("MLA d_c=128", "mla", 8, {"latent_dim": 128}),
            ("performer", "performer", 8, None),
        )
    }
    assert per_token == {"MHA": 1024, "GQA": 256, "MQA": 128, "MLA": 256, "MLA d_c=128": 128, "performer": 0}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_kv_heads=2), "num_kv_heads with attention_type='mla'"),
        (dict(fused_qkv=True), "fused_qkv with attention_type='mla'"),
        (dict(attention_options={"d_c": 4}), "attention_options"),
    ],
)
def test_bad_settings_raise_naming_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        attention.MultiHeadAttention(num_heads=H, attention_type="mla", **kwargs).init(jax.random.key(0), x_input())
