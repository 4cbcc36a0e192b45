"""Decoding beyond Flax's: prompt prefill, per-sequence positions, causal steps equal to the full pass."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import attention

B, T, D = 3, 8, 16
X = jax.random.normal(jax.random.key(1), (B, T, D))
PROMPTS = np.array([2, 5, 3])  # ragged prompt lengths, right-padded to 5 in the prefill call


@nnx.jit
def decode(layer, tokens, lengths):
    return layer(tokens, decode=True, lengths=lengths)


@nnx.jit
def full_causal(layer, x):
    return layer(x, is_causal=True, decode=False)


def at_positions(x, positions):
    """x `[B, T, ...]`, positions `[B, L]` -> `[B, L, ...]`."""
    return jnp.take_along_axis(x, positions.reshape(*positions.shape, *(1,) * (x.ndim - 2)), axis=1)


# MHA, GQA and MQA, and every impl that runs on CPU ("auto" picks vmap at these sizes, "cudnn" needs a GPU)
CASES = [("vmap", 4), ("vmap", 1), ("einsum", 2), ("xla", 1), ("blockwise", 2)]


@pytest.mark.parametrize("impl, kv_heads", CASES, ids=[f"{i}-G{g}" for i, g in CASES])
def test_ragged_prefill_then_steps_equal_the_full_causal_pass(impl, kv_heads):
    layer = attention.nnx.MultiHeadAttention(
        4, D, num_kv_heads=kv_heads, impl=impl, block_sizes=(2, 4), rngs=nnx.Rngs(0)
    )
    full = full_causal(layer, X)
    layer.init_cache(X.shape)
    # right-padded prompts; the padding (zeros here) is written past each index and never seen
    prompt = jnp.where(jnp.arange(5)[None, :, None] < PROMPTS[:, None, None], X[:, :5], 0.0)
    out = decode(layer, prompt, jnp.asarray(PROMPTS))
    for b, n in enumerate(PROMPTS):
        np.testing.assert_allclose(out[b, :n], full[b, :n], atol=1e-5, err_msg=f"prefill, sequence {b}")
    np.testing.assert_array_equal(layer.cache_index[...], PROMPTS)
    # a two-token chunk with one real token for sequence 1, then single steps
    for size, real in ((2, np.array([2, 1, 2])), (1, None), (1, None)):
        positions = layer.cache_index[...][:, None] + jnp.arange(size)[None, :]
        lengths = None if real is None else jnp.asarray(real)
        out = decode(layer, at_positions(X, jnp.minimum(positions, T - 1)), lengths)
        want = at_positions(full, jnp.minimum(positions, T - 1))
        for b in range(B):
            n = size if real is None else real[b]
            np.testing.assert_allclose(out[b, :n], want[b, :n], atol=1e-5, err_msg=f"positions {positions[b]}")
    np.testing.assert_array_equal(layer.cache_index[...], PROMPTS + np.array([4, 3, 4]))


def test_one_prefill_call_for_all_equals_flax_style_single_steps():
    """An unragged prompt in one call, then steps, against the full causal pass (cache index [batch])."""
    layer = attention.nnx.MultiHeadAttention(4, D, num_kv_heads=2, decode=True, rngs=nnx.Rngs(0))
    full = full_causal(layer, X)
    layer.init_cache(X.shape)
    outs = [decode(layer, X[:, :4], None)] + [decode(layer, X[:, t : t + 1], None) for t in range(4, T)]
    np.testing.assert_allclose(jnp.concatenate(outs, axis=1), full, atol=1e-5)
    np.testing.assert_array_equal(layer.cache_index[...], [T] * B)


def test_decode_through_flaxs_attention_fn_equals_the_full_causal_pass():
    """A user's `attention_fn` (Flax's own here) reads the heads-first cache in Flax's layout, handed over so."""
    layer = attention.nnx.MultiHeadAttention(4, D, attention_fn=nnx.dot_product_attention, rngs=nnx.Rngs(0))
    full = full_causal(layer, X)
    layer.init_cache(X.shape)
    outs = [decode(layer, X[:, t : t + 1], None) for t in range(T)]
    np.testing.assert_allclose(jnp.concatenate(outs, axis=1), full, atol=1e-5)


def test_decode_mask_is_anded_with_the_causal_cache_mask():
    """A key-padding mask in decode equals the full causal pass with the same mask."""
    layer = attention.nnx.MultiHeadAttention(4, D, num_kv_heads=2, rngs=nnx.Rngs(0))
    keys_ok = jnp.arange(T)[None, :] != jnp.array([[1], [2], [6]])  # one masked key per sequence (never a whole row)
    mask = keys_ok[:, None, None, :]
    full = nnx.jit(lambda m, x: m(x, mask=mask, is_causal=True))(layer, X)
    layer.init_cache(X.shape)
    step = nnx.jit(lambda m, x: m(x, mask=mask, decode=True))
    outs = [step(layer, X[:, :5]), step(layer, X[:, 5:6]), step(layer, X[:, 6:])]
    np.testing.assert_allclose(jnp.concatenate(outs, axis=1), full, atol=1e-5)


def test_donated_decode_step_writes_the_cache_in_place():
    """jit with the cache donated: XLA aliases it to the updated cache (else JAX warns and copies)."""
    layer = attention.nnx.MultiHeadAttention(4, D, num_kv_heads=2, decode=True, rngs=nnx.Rngs(0))
    layer.init_cache(X.shape)
    graphdef, params, cache = nnx.split(layer, nnx.Param, nnx.Cache)

    def step(cache, params, token):
        model = nnx.merge(graphdef, params, cache)
        return model(token), nnx.state(model, nnx.Cache)

    step = jax.jit(step, donate_argnums=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Some donated buffers were not usable" would fail here
        _, updated = step(cache, params, X[:, :1])
    assert cache["cached_key"][...].is_deleted() and cache["cached_value"][...].is_deleted()
    np.testing.assert_array_equal(updated["cache_index"][...], [1] * B)


def test_writes_past_the_end_are_dropped_not_clamped():
    layer = attention.nnx.MultiHeadAttention(2, D, rngs=nnx.Rngs(0))
    layer.init_cache((B, 4, D))
    decode(layer, X[:, :3], None)
    before = layer.cached_key[...]
    decode(layer, X[:, 3:5], None)  # position 4 does not exist: dropped, positions 0..3 kept
    np.testing.assert_array_equal(layer.cached_key[...][..., :3, :], before[..., :3, :])


def test_bad_decode_arguments_raise_naming_them():
    layer = attention.nnx.MultiHeadAttention(4, D, decode=True, rngs=nnx.Rngs(0))
    layer.init_cache(X.shape)
    with pytest.raises(ValueError, match="lengths"):
        layer(X[:, :2], lengths=jnp.array([1, 2]))
    with pytest.raises(ValueError, match="lengths"):
        layer(X[:, :2], lengths=jnp.array([1.0, 2.0, 1.0]))
    with pytest.raises(ValueError, match="cache holds 8 positions"):
        layer(jnp.concatenate([X, X], axis=1))
    with pytest.raises(ValueError, match="input_shape"):
        layer.init_cache((D,))


@pytest.mark.parametrize("decode", [False, True])
def test_cache_cross_kv_stores_the_source_once_in_decode_and_reuses_it(decode):
    """A cross-attention layer with `cache_cross_kv`: its first call after `init_cache` stores the projected
    source (head-first, x W + b in NumPy), later calls read it and not their inputs_k; `init_cache` clears it.
    `decode` changes none of this (as on the Linen layer)."""
    source, other = (jax.random.normal(jax.random.key(s), (B, 5, D)) for s in (2, 3))
    layer = attention.nnx.MultiHeadAttention(4, D, num_kv_heads=2, cache_cross_kv=True, rngs=nnx.Rngs(0))
    full = layer(X, source, decode=decode)  # no decode state: nothing stored, the inputs are read
    assert layer.cross_key is None
    np.testing.assert_allclose(layer(X, other, decode=decode), layer(X, other), atol=1e-6)
    layer.init_cache((B, T, D))
    assert layer.cross_key.shape == (B, 2, 0, D // 4)  # set up, none kept yet
    first = layer(X[:, :2], source, decode=decode)
    for name in ("key", "value"):
        p = getattr(layer, name)
        want = np.einsum("bld,dgk->blgk", np.asarray(source), np.asarray(p.kernel[...])) + np.asarray(p.bias[...])
        np.testing.assert_allclose(getattr(layer, f"cross_{name}")[...], want.transpose(0, 2, 1, 3), atol=1e-5)
    np.testing.assert_allclose(first, full[:, :2], atol=1e-5)
    later = layer(X[:, 2:3], other, decode=decode)  # `other` is not read: the stored source answers
    np.testing.assert_allclose(later, full[:, 2:3], atol=1e-5)
    layer.init_cache((B, T, D))  # a new source
    assert layer.cross_key.shape[-2] == 0
    np.testing.assert_allclose(layer(X[:, :1], other, decode=decode), layer(X[:, :1], other), atol=1e-5)


def test_a_decode_view_keeps_the_source_and_leaves_the_layer_projecting():
    """`nnx.view(..., decode=True, ...)`, one switch for a model, sets up a `cache_cross_kv` layer's decode state on
    the view: the view keeps its first source, the layer it was made from still projects each call's."""
    source, other = (jax.random.normal(jax.random.key(s), (B, 5, D)) for s in (2, 3))
    layer = attention.nnx.MultiHeadAttention(4, D, num_kv_heads=2, cache_cross_kv=True, rngs=nnx.Rngs(0))
    view = nnx.view(layer, decode=True, batch_size=B, max_length=T)
    first = view(X[:, :1], source)
    np.testing.assert_allclose(view(X[:, 1:2], other), layer(X[:, 1:2], source), atol=1e-6)
    np.testing.assert_allclose(first, layer(X[:, :1], source), atol=1e-6)
    assert layer.cross_key is None and view.cross_key.shape == (B, 2, 5, D // 4)
    assert not np.allclose(layer(X[:, 1:2], other), view(X[:, 1:2], other))
