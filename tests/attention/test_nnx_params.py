"""Params both ways: Linen attention params (ours, Flax's) <-> NNX layer state (ours, Flax's), by equal outputs."""

import flax.linen as nn
import jax
import numpy as np
import pytest
from flax import nnx

import attention
from attention.nnx import load_linen_params, to_linen_params

X = jax.random.normal(jax.random.key(1), (2, 6, 16))
CONFIGS = {
    "MHA": dict(num_heads=4),
    "GQA+qk-norm": dict(num_heads=4, num_kv_heads=2, normalize_qk=True),
    "MQA+v_head_dim": dict(num_heads=4, num_kv_heads=1, v_head_dim=3),
    "fused": dict(num_heads=4, num_kv_heads=2, fused_qkv=True),
}


def nnx_layer(config, seed=1):
    return attention.nnx.MultiHeadAttention(in_features=16, **config, rngs=nnx.Rngs(seed))


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_our_linen_layer_and_our_nnx_layer_both_ways(config):
    linen = attention.MultiHeadAttention(**config)
    params = linen.init(jax.random.key(0), X)["params"]
    layer = nnx_layer(config)
    load_linen_params(layer, params)
    np.testing.assert_allclose(layer(X, is_causal=True), linen.apply({"params": params}, X, is_causal=True), atol=1e-5)
    other = nnx_layer(config, seed=2)  # NNX -> Linen
    np.testing.assert_allclose(linen.apply({"params": to_linen_params(other)}, X), other(X), atol=1e-5)


def test_flax_linen_layer_and_our_nnx_layer_both_ways():
    flax_linen = nn.MultiHeadDotProductAttention(num_heads=4, normalize_qk=True)
    params = flax_linen.init(jax.random.key(0), X)["params"]
    layer = nnx_layer(dict(num_heads=4, normalize_qk=True))
    load_linen_params(layer, params)
    np.testing.assert_allclose(layer(X), flax_linen.apply({"params": params}, X), atol=1e-5)
    other = nnx_layer(dict(num_heads=4, normalize_qk=True), seed=2)
    np.testing.assert_allclose(flax_linen.apply({"params": to_linen_params(other)}, X), other(X), atol=1e-5)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_flax_nnx_layer_and_our_linen_layer_both_ways(kv_heads):
    flax_nnx = nnx.MultiHeadAttention(4, 16, num_kv_heads=kv_heads, decode=False, rngs=nnx.Rngs(3))
    linen = attention.MultiHeadAttention(num_heads=4, num_kv_heads=kv_heads)
    np.testing.assert_allclose(linen.apply({"params": to_linen_params(flax_nnx)}, X), flax_nnx(X), atol=1e-5)
    params = linen.init(jax.random.key(0), X)["params"]
    load_linen_params(flax_nnx, params)
    np.testing.assert_allclose(flax_nnx(X), linen.apply({"params": params}, X), atol=1e-5)


def test_mismatched_params_raise_naming_the_path():
    layer = nnx_layer(dict(num_heads=4, num_kv_heads=2))
    params = attention.MultiHeadAttention(num_heads=4).init(jax.random.key(0), X)["params"]
    with pytest.raises(ValueError, match=r"key/bias has shape \(4, 4\); the layer expects \(2, 4\)"):
        load_linen_params(layer, params)
    params = attention.MultiHeadAttention(num_heads=4, num_kv_heads=2, use_bias=False).init(jax.random.key(0), X)[
        "params"
    ]
    with pytest.raises(ValueError, match="bias is missing"):
        load_linen_params(layer, params)
    with pytest.raises(ValueError, match="query_ln/scale is not a parameter"):
        load_linen_params(layer, {**to_linen_params(layer), "query_ln": {"scale": np.ones(4)}})
