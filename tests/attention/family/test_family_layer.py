"""The `attention_type` selector on `attention.MultiHeadAttention`: default unchanged, members' decode, refusals."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention
from attention import family
from chunked import decode_in_chunks

RNG = np.random.default_rng(0)
X = jnp.asarray(RNG.normal(size=(2, 6, 16)), jnp.float32)


def test_softmax_is_the_default_and_unchanged():
    layer = attention.MultiHeadAttention(num_heads=4, num_kv_heads=2)
    params = layer.init(jax.random.key(0), X)
    explicit = layer.clone(attention_type="softmax")
    assert jax.tree.map(jnp.shape, explicit.init(jax.random.key(0), X)) == jax.tree.map(jnp.shape, params)
    np.testing.assert_array_equal(explicit.apply(params, X, is_causal=True), layer.apply(params, X, is_causal=True))


@pytest.mark.parametrize("attention_type", ["performer"])  # span: family/test_span.py, mla: family/test_mla.py
def test_layer_decode_equals_the_full_pass(attention_type):
    layer = attention.MultiHeadAttention(num_heads=4, num_kv_heads=2, attention_type=attention_type, decode=True)
    variables = layer.init(jax.random.key(0), X)
    full = layer.clone(decode=False).apply({"params": variables["params"]}, X, is_causal=True)
    np.testing.assert_allclose(
        decode_in_chunks(layer, variables, X, ((0, 2), (2, 3), (3, 6))), full, rtol=1e-4, atol=1e-5
    )


def test_members_keep_the_layer_projections_and_add_their_own_parameters():
    shapes = lambda t, **o: jax.tree.map(
        jnp.shape,
        attention.MultiHeadAttention(num_heads=4, attention_type=t, attention_options=o or None).init(
            jax.random.key(0), X
        )["params"],
    )
    assert shapes("linformer", max_length=8, projected_length=3)["linformer"] == {"E": (3, 8), "F": (3, 8)}
    assert shapes("performer", num_features=5)["performer"] == {"random_features": (5, 4)}
    assert shapes("entmax")["entmax"] == {"alpha_logit": (4,)}
    assert shapes("span")["span"] == {"span": (4,)}
    assert set(shapes("entmax")) == {"query", "key", "value", "out", "entmax"}


def test_supports_says_which_sublayers_a_member_can_serve():
    assert family.supports("softmax", causal=True, cross=True, decode=True)
    assert not family.supports("linformer", causal=True) and family.supports("linformer", cross=True)
    assert not family.supports("span", cross=True)
    assert family.supports("performer", causal=True, decode=True)


@pytest.mark.parametrize(
    "kwargs, call, message",
    [
        (dict(attention_type="flash"), {}, "attention_type = 'flash'; expected one of"),
        (dict(attention_type="entmax", attention_options={"k": 3}), {}, "attention_options = {'k': 3}"),
        (dict(attention_type="softmax", attention_options={"k": 3}), {}, "attention_options"),
        (dict(attention_type="linformer"), dict(is_causal=True), "is_causal with attention_type='linformer'"),
        (dict(attention_type="linformer", decode=True), {}, "is_causal with attention_type='linformer'"),
        (dict(attention_type="span"), dict(inputs_k=X[:, :3]), "inputs_k with attention_type='span'"),
        (dict(attention_type="entmax", dropout_rate=0.1, deterministic=True), {}, "dropout_rate with"),
        (dict(attention_type="entmax"), dict(sow_weights=True), "sow_weights with"),
        (dict(attention_type="performer"), dict(mask=jnp.ones((2, 1, 6, 6), bool)), "key-padding masks"),
        (
            dict(attention_type="linformer", attention_options={"projected_length": 0}),
            {},
            "linformer projected_length = 0; expected a positive int",
        ),
        (dict(attention_type="span", attention_options={"ramp": 2.5}), {}, "span ramp = 2.5; expected a positive int"),
        (
            dict(attention_type="lsh", attention_options={"num_hashes": True}),
            {},
            "lsh num_hashes = True; expected a positive int",
        ),
    ],
)
def test_bad_settings_raise_naming_the_field(kwargs, call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        attention.MultiHeadAttention(num_heads=4, **kwargs).init(jax.random.key(0), X, **call)
