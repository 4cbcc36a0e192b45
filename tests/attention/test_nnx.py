"""`attention.nnx.MultiHeadAttention` against `flax.nnx.MultiHeadAttention` itself: same params, same outputs."""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import attention

X = jax.random.normal(jax.random.key(1), (2, 6, 16))


def flax_and_ours(*args, seed=0, **kwargs):
    """Flax's layer and ours from the same arguments and the same `nnx.Rngs`."""
    kwargs.setdefault("decode", False)
    extras = {k: kwargs.pop(k) for k in ("impl", "block_sizes") if k in kwargs}
    theirs = nnx.MultiHeadAttention(*args, **kwargs, rngs=nnx.Rngs(seed, dropout=seed + 1))
    ours = attention.nnx.MultiHeadAttention(*args, **kwargs, **extras, rngs=nnx.Rngs(seed, dropout=seed + 1))
    return theirs, ours


@functools.partial(nnx.jit, static_argnames=("deterministic", "is_causal"))
def run(layer, x, mask=None, rngs=None, deterministic=None, is_causal=False):
    """`layer(x, ...)` under `nnx.jit`: one compile instead of many eager ops."""
    return layer(x, mask=mask, rngs=rngs, deterministic=deterministic, is_causal=is_causal)


def params(layer):
    return nnx.to_pure_dict(nnx.state(layer, nnx.Param))


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_same_parameter_paths_shapes_and_values_as_flax(kv_heads):
    theirs, ours = flax_and_ours(4, 16, 8, 12, num_kv_heads=kv_heads, normalize_qk=True)
    jax.tree.map(np.testing.assert_array_equal, params(ours), params(theirs))
    assert params(ours)["key"]["kernel"].shape == (16, kv_heads, 2)


@pytest.mark.parametrize("impl, kv_heads", [("vmap", 4), ("einsum", 2), ("xla", 1), ("blockwise", 2)])
def test_self_attention_with_masks_matches_flax(impl, kv_heads):
    theirs, ours = flax_and_ours(4, 16, num_kv_heads=kv_heads, impl=impl, block_sizes=(4, 4))
    causal = nnx.make_causal_mask(X[..., 0])  # Flax's float32 0/1 mask
    padding = nnx.make_attention_mask(jnp.ones((2, 6)), jnp.arange(6)[None, :] < jnp.array([[4], [6]]))
    for mask in (None, causal, padding, padding.astype(bool)):
        np.testing.assert_allclose(run(ours, X, mask=mask), run(theirs, X, mask=mask), atol=1e-5)
    np.testing.assert_allclose(run(ours, X, is_causal=True), run(theirs, X, is_causal=True), atol=1e-5)


def test_cross_attention_with_other_sizes_matches_flax():
    theirs, ours = flax_and_ours(2, 16, qkv_features=8, out_features=5, in_kv_features=3, use_bias=False)
    kv = jax.random.normal(jax.random.key(2), (2, 9, 3))
    np.testing.assert_allclose(ours(X, kv), theirs(X, kv), atol=1e-5)
    v = jax.random.normal(jax.random.key(3), (2, 9, 3))
    np.testing.assert_allclose(ours(X, kv, v), theirs(X, kv, v), atol=1e-5)


def test_dropout_with_the_same_rngs_matches_flax():
    for broadcast in (False, True):
        theirs, ours = flax_and_ours(4, 16, num_kv_heads=2, dropout_rate=0.3, broadcast_dropout=broadcast)
        np.testing.assert_allclose(run(ours, X, deterministic=False), run(theirs, X, deterministic=False), atol=1e-5)
    # the kept stream advances the same way; rngs given at the call take precedence
    np.testing.assert_allclose(run(ours, X, deterministic=False), run(theirs, X, deterministic=False), atol=1e-5)
    np.testing.assert_allclose(
        run(ours, X, rngs=nnx.Rngs(dropout=7), deterministic=False),
        run(theirs, X, rngs=nnx.Rngs(dropout=7), deterministic=False),
        atol=1e-5,
    )
    assert not np.allclose(run(ours, X, deterministic=False), run(ours, X, deterministic=True))


def sown_weights(layer, *args, **kwargs):
    """The layer's output and its `attention_weights` tuple, collected as Flax collects them: `nnx.capture`."""
    out, intermediates = nnx.capture(layer, nnx.Intermediate)(*args, sow_weights=True, **kwargs)
    return out, intermediates["attention_weights"].get_value()


def test_sown_weights_match_flax():
    theirs, ours = flax_and_ours(4, 16, num_kv_heads=2, attention_fn=nnx.dot_product_attention)
    ours.attention_fn = None  # ours through attention.attend, theirs through Flax's function
    _, (w_theirs,) = sown_weights(theirs, X, mask=nnx.make_causal_mask(X[..., 0]))
    _, (w_ours,) = sown_weights(ours, X, mask=nnx.make_causal_mask(X[..., 0]))
    assert w_ours.shape == (2, 4, 6, 6)
    np.testing.assert_allclose(w_ours, w_theirs, atol=1e-6)


def test_attention_fn_is_called_as_flax_calls_it():
    calls = []

    def attention_fn(query, key, value, **kwargs):
        calls.append(sorted(kwargs))
        return nnx.dot_product_attention(query, key, value, **kwargs)

    theirs, ours = flax_and_ours(4, 16, attention_fn=attention_fn, dropout_rate=0.2)
    y_ours, w_ours = sown_weights(ours, X, deterministic=False)
    y_theirs, w_theirs = sown_weights(theirs, X, deterministic=False)
    np.testing.assert_allclose(y_ours, y_theirs, atol=1e-5)
    assert calls[0] == calls[1] and "module" in calls[0] and "is_causal" in calls[0]
    np.testing.assert_allclose(w_ours[0], w_theirs[0], atol=1e-6)


@pytest.mark.parametrize("attention_fn", [None, nnx.dot_product_attention])
def test_sowing_weights_under_capture_raises_no_sow_deprecation(attention_fn):
    """Flax deprecates `Module.sow` outside `nnx.capture`; the layer sows only through it, as Flax's layer does."""
    layer = attention.nnx.MultiHeadAttention(4, 16, attention_fn=attention_fn, decode=False, rngs=nnx.Rngs(0))
    sow = nnx.jit(nnx.capture(lambda m, x: m(x, sow_weights=True), nnx.Intermediate))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*sow", category=DeprecationWarning)
        _, (weights,) = sown_weights(layer, X)
        _, intermediates = sow(layer, X)
    assert weights.shape == intermediates["attention_weights"][0].shape == (2, 4, 6, 6)
    np.testing.assert_allclose(intermediates["attention_weights"][0], weights, atol=1e-6)
    assert not hasattr(layer, "attention_weights")  # nothing left on the layer


@pytest.mark.parametrize("kv_heads", [4, 1])
def test_decode_one_token_at_a_time_matches_flax(kv_heads):
    theirs, ours = flax_and_ours(4, 16, num_kv_heads=kv_heads, decode=True)
    theirs.init_cache(X.shape)
    ours.init_cache(X.shape)
    step = nnx.jit(lambda m, x: m(x))
    for t in range(X.shape[1]):
        np.testing.assert_allclose(
            step(ours, X[:, t : t + 1]), step(theirs, X[:, t : t + 1]), atol=1e-5, err_msg=f"step {t}"
        )
    np.testing.assert_array_equal(ours.cache_index[...], [6, 6])


def test_set_view_allocates_the_cache():
    ours = attention.nnx.MultiHeadAttention(4, 16, num_kv_heads=2, rngs=nnx.Rngs(0))
    view = nnx.view(ours, decode=True, batch_size=2, max_length=6)
    assert view.decode and view.cached_key.shape == (2, 2, 6, 4) and view.cache_index.shape == (2,)
    out = view(X[:, :1])
    np.testing.assert_allclose(out, ours(X[:, :1], decode=False), atol=1e-5)


def test_head_mask_equals_zeroing_that_heads_rows_of_w_o():
    theirs, ours = flax_and_ours(4, 16, num_kv_heads=2)
    theirs.out.kernel[...] = theirs.out.kernel[...].at[1].set(0.0)
    np.testing.assert_allclose(ours(X, head_mask=jnp.array([1.0, 0.0, 1.0, 1.0])), theirs(X), atol=1e-5)


def test_fused_qkv_equals_separate_projections():
    theirs, ours = flax_and_ours(4, 16, num_kv_heads=2)
    fused = attention.nnx.MultiHeadAttention(4, 16, num_kv_heads=2, fused_qkv=True, rngs=nnx.Rngs(0))
    assert fused.qkv.kernel.shape == (16, 8, 4)
    for name in ("kernel", "bias"):
        parts = [getattr(getattr(theirs, p), name)[...] for p in ("query", "key", "value")]
        getattr(fused.qkv, name)[...] = jnp.concatenate(parts, axis=-2)
    fused.out = theirs.out
    np.testing.assert_allclose(fused(X), theirs(X), atol=1e-5)


def test_value_head_dim_shapes():
    ours = attention.nnx.MultiHeadAttention(4, 16, num_kv_heads=2, v_head_dim=3, rngs=nnx.Rngs(0))
    assert ours.value.kernel.shape == (16, 2, 3) and ours.out.kernel.shape == (4, 3, 16)
    assert ours(X).shape == X.shape


def test_jit_and_grad_through_the_layer():
    _, ours = flax_and_ours(4, 16, num_kv_heads=2, dropout_rate=0.1)

    @nnx.jit
    def loss_and_grad(layer, x):
        return nnx.value_and_grad(lambda m: jnp.mean(m(x, deterministic=False) ** 2))(layer)

    loss, grads = loss_and_grad(ours, X)
    assert np.isfinite(loss) and set(grads) == {"query", "key", "value", "out"}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_heads=3, in_features=16), "qkv_features"),
        (dict(num_heads=4, in_features=16, num_kv_heads=3), "num_kv_heads"),
        (dict(num_heads=4, in_features=0), "in_features"),
        (dict(num_heads=4, in_features=16, impl="flash"), "impl"),
        (dict(num_heads=4, in_features=16, block_sizes=(0, 4)), "block_sizes"),
        (dict(num_heads=4, in_features=16, dropout_rate=1.0), "dropout_rate"),
        (dict(num_heads=4, in_features=16, fused_qkv=True, v_head_dim=2), "v_head_dim"),
        (dict(num_heads=4, in_features=16, fused_qkv=True, in_kv_features=8), "in_kv_features"),
    ],
)
def test_bad_arguments_raise_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        attention.nnx.MultiHeadAttention(**kwargs, rngs=nnx.Rngs(0))


def test_bad_call_arguments_raise_naming_them():
    layer = attention.nnx.MultiHeadAttention(4, 16, fused_qkv=True, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="in_features"):
        layer(jnp.ones((2, 6, 8)))
    with pytest.raises(ValueError, match="fused_qkv"):
        layer(X, X[:, :3])
    with pytest.raises(ValueError, match="mask"):
        layer(X, mask=jnp.ones((2, 4, 6, 5), bool))
    with pytest.raises(ValueError, match="head_mask"):
        layer(X, head_mask=jnp.ones((3,)))
    with pytest.raises(ValueError, match="init_cache"):
        layer(X, decode=True)
    with pytest.raises(ValueError, match="lengths"):
        layer(X, lengths=jnp.array([1, 2]))
    with pytest.raises(ValueError, match="input_positions"):
        layer(X, input_positions=jnp.arange(6))
    with pytest.raises(ValueError, match="batch_size and max_length"):
        nnx.view(layer, decode=True, batch_size=2)
    dropout = attention.nnx.MultiHeadAttention(4, 16, dropout_rate=0.1, keep_rngs=False, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="rngs"):
        dropout(X, deterministic=False)
