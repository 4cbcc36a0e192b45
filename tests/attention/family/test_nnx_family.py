"""`attention_type` on the NNX layer: the Linen layer's members, same parameters -> same outputs, and decoding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import attention
from attention import family
from attention.nnx import load_linen_params, to_linen_params

B, T, D = 3, 8, 16
X = jax.random.normal(jax.random.key(1), (B, T, D))
Y = jax.random.normal(jax.random.key(2), (B, 5, D))  # another sequence, for cross-attention
PAD = jnp.arange(T)[None, :] < jnp.array([8, 5, 6])[:, None]  # key padding [B, T]
# every member, in a small setting where its approximation is exercised (not its exact limit)
MEMBERS = {
    "bigbird": (dict(block_size=2, random_blocks=1), 2),
    "lsh": (dict(chunk_length=2, num_buckets=2), 4),
    "linformer": (dict(max_length=8, projected_length=3), 2),
    "performer": (dict(num_features=6), 1),
    "entmax": ({}, 2),
    "span": (dict(max_span=3, ramp=2, span_init=0.7), 2),
    "mla": (dict(latent_dim=8), 4),
}


def layers(attention_type, seed=1, **extra):
    options, kv_heads = MEMBERS[attention_type]
    config = dict(num_heads=4, num_kv_heads=kv_heads, attention_type=attention_type, attention_options=options, **extra)
    return attention.MultiHeadAttention(**config), attention.nnx.MultiHeadAttention(
        in_features=D, **config, rngs=nnx.Rngs(seed)
    )


@nnx.jit
def decode(layer, x, lengths=None):
    return layer(x, decode=True, lengths=lengths)


@pytest.mark.parametrize("attention_type", MEMBERS)
def test_linen_params_give_the_linen_layers_outputs_and_read_back(attention_type):
    linen, layer = layers(attention_type)
    params = linen.init(jax.random.key(0), X)["params"]
    assert jax.tree.map(jnp.shape, to_linen_params(layer)) == jax.tree.map(jnp.shape, params)
    load_linen_params(layer, params)
    causal = family.supports(attention_type, causal=True)
    mask = PAD[:, None, None, :]  # key padding: every member honours it
    np.testing.assert_allclose(
        layer(X, mask=mask, is_causal=causal),
        linen.apply({"params": params}, X, mask=mask, is_causal=causal),
        atol=1e-5,
    )
    # and back: the state, read as Linen params, is the tree that went in (the paths are Linen's)
    jax.tree.map(np.testing.assert_array_equal, to_linen_params(layer), params)


@pytest.mark.parametrize("attention_type", [t for t in MEMBERS if family.supports(t, cross=True)])
def test_cross_attention_matches_the_linen_layer(attention_type):
    linen, layer = layers(attention_type)
    params = linen.init(jax.random.key(0), X, Y)["params"]
    load_linen_params(layer, params)
    np.testing.assert_allclose(layer(X, Y), linen.apply({"params": params}, X, Y), atol=1e-5)


@pytest.mark.parametrize("attention_type", ["entmax", "span"])
def test_kv_cache_members_decode_ragged_prompts_as_the_full_causal_pass(attention_type):
    _, layer = layers(attention_type)
    full = layer(X, is_causal=True)
    layer.init_cache(X.shape)
    prompts = np.array([2, 5, 3])
    out = decode(layer, X[:, :5], jnp.asarray(prompts))  # right-padded prompts
    for b, n in enumerate(prompts):
        np.testing.assert_allclose(out[b, :n], full[b, :n], atol=1e-5, err_msg=f"prefill, sequence {b}")
    for _ in range(2):  # one token a step, each sequence at its own position
        positions = layer.cache_index[...]
        out = decode(layer, X[np.arange(B), positions][:, None])
        np.testing.assert_allclose(out[:, 0], full[np.arange(B), positions], atol=1e-5)
    np.testing.assert_array_equal(layer.cache_index[...], prompts + 2)


@pytest.mark.parametrize("attention_type", ["performer", "mla"])
def test_state_members_prefill_then_step_as_the_full_causal_pass(attention_type):
    _, layer = layers(attention_type)
    full = layer(X, is_causal=True)
    layer.init_cache(X.shape)
    pieces = [decode(layer, X[:, lo:hi]) for lo, hi in ((0, 3), (3, 4), (4, 8))]
    np.testing.assert_allclose(jnp.concatenate(pieces, axis=1), full, atol=1e-5)


def test_nnx_view_allocates_a_state_members_decode_state():
    _, layer = layers("performer")
    view = nnx.view(layer, decode=True, batch_size=B, max_length=T)
    state = jax.tree.map(jnp.shape, nnx.to_pure_dict(nnx.state(view, nnx.Cache)))
    assert state == {"performer": {"state_kv": (B, 1, 6, 4), "state_z": (B, 1, 6), "state_shift": (B, 1, 6)}}


def test_members_make_only_the_projections_they_use():
    assert set(to_linen_params(layers("mla")[1])) == {"mla", "out"}
    assert set(to_linen_params(layers("lsh")[1])) == {"query", "value", "lsh", "out"}
    assert set(to_linen_params(layers("entmax")[1])) == {"query", "key", "value", "entmax", "out"}


@pytest.mark.parametrize(
    "extra, message",
    [
        (dict(attention_type="flash"), "attention_type = 'flash'; expected one of"),
        (dict(attention_type="entmax", attention_options={"k": 3}), "attention_options = {'k': 3}"),
        (dict(attention_type="lsh", fused_qkv=True), "MultiHeadAttention.fused_qkv with attention_type='lsh'"),
        (dict(attention_type="entmax", dropout_rate=0.1), "MultiHeadAttention.dropout_rate with attention_type"),
        (dict(attention_type="lsh", num_kv_heads=2), "MultiHeadAttention.num_kv_heads with attention_type='lsh'"),
        (dict(attention_type="bigbird", decode=True), "MultiHeadAttention.decode with attention_type='bigbird'"),
        (dict(attention_type="mla", normalize_qk=True), "MultiHeadAttention.normalize_qk with attention_type='mla'"),
    ],
)
def test_settings_a_member_cannot_honour_raise_at_construction(extra, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        attention.nnx.MultiHeadAttention(4, D, rngs=nnx.Rngs(0), **extra)


def test_calls_a_member_cannot_serve_raise_naming_the_argument():
    _, span = layers("span")
    with pytest.raises(ValueError, match="MultiHeadAttention.inputs_k with attention_type='span'"):
        span(X, Y)
    with pytest.raises(ValueError, match="sow_weights with attention_type='span'"):
        span(X, sow_weights=True)
    with pytest.raises(ValueError, match="input_positions"):
        span(X, input_positions=jnp.arange(T))
    _, linformer = layers("linformer")
    with pytest.raises(ValueError, match="is_causal with attention_type='linformer'"):
        linformer(X, is_causal=True)
    _, performer = layers("performer")
    with pytest.raises(ValueError, match="init_cache"):
        performer(X, decode=True)
    performer.init_cache(X.shape)
    with pytest.raises(ValueError, match="lengths with attention_type='performer'"):
        performer(X[:, :2], decode=True, lengths=jnp.array([1, 2, 2]))
    with pytest.raises(ValueError, match="decode=False with attention_type='performer'"):
        performer(X, decode=False)
