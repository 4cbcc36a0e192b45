"""`attention.MultiHeadAttention` against Flax's own module, NumPy and the design documents' worked example."""

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention
import reference

KEY = jax.random.key(0)


def inputs(shape=(2, 6, 16), seed=0):
    return jax.random.normal(jax.random.key(seed), shape)


def test_worked_example_from_the_design_documents():
    """d_model 4, h 2, identity W^Q = W^K = W^V = W^O: scores by hand."""
    x = jnp.array([[[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]]], jnp.float32)
    layer = attention.MultiHeadAttention(num_heads=2, use_bias=False)
    identity_in = jnp.eye(4).reshape(4, 2, 2)
    params = {
        "query": {"kernel": identity_in},
        "key": {"kernel": identity_in},
        "value": {"kernel": identity_in},
        "out": {"kernel": jnp.eye(4).reshape(2, 2, 4)},
    }
    out, state = layer.apply({"params": params}, x, sow_weights=True, mutable=["intermediates"])
    weights = np.asarray(state["intermediates"]["attention_weights"][0])[0]  # [H, 3, 3]

    head1_scores = np.array([[1, 0, 1], [0, 1, 1], [1, 1, 2]]) / np.sqrt(2)
    head1_weights = np.exp(head1_scores) / np.exp(head1_scores).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(weights[0], head1_weights, atol=1e-6)
    np.testing.assert_allclose(weights[0, 0], [0.40111209, 0.19777581, 0.40111209], atol=1e-6)
    np.testing.assert_allclose(weights[1, 2], [1 / 3, 1 / 3, 1 / 3], atol=1e-6)  # zero query vector
    # with identity projections the output is each head's weights times its slice of X
    expected = np.concatenate([weights[0] @ x[0, :, :2], weights[1] @ x[0, :, 2:]], axis=-1)
    np.testing.assert_allclose(out[0], expected, atol=1e-6)


@pytest.mark.parametrize(
    "kv_heads, expected", [(8, 4 * 512**2), (2, 2 * 512**2 + 2 * 512 * 2 * 64), (1, 2 * 512**2 + 2 * 512 * 64)]
)
def test_parameter_counts(kv_heads, expected):
    layer = attention.MultiHeadAttention(num_heads=8, num_kv_heads=kv_heads, use_bias=False)
    shapes = jax.eval_shape(layer.init, KEY, jnp.zeros((1, 3, 512)))
    assert sum(np.prod(p.shape) for p in jax.tree.leaves(shapes)) == expected


def flax_and_ours(**kwargs):
    return nn.MultiHeadDotProductAttention(**kwargs), attention.MultiHeadAttention(**kwargs)


@pytest.mark.parametrize("impl", ["vmap", "einsum", "xla"])
def test_same_init_and_outputs_as_flax_self_attention_with_masks(impl):
    theirs, ours = flax_and_ours(num_heads=4)
    ours = ours.clone(impl=impl)
    x = inputs()
    params = theirs.init(KEY, x)
    assert jax.tree.all(jax.tree.map(jnp.array_equal, params, ours.init(KEY, x)))
    tokens = np.array([[3, 4, 5, 6, 0, 0], [7, 8, 9, 1, 2, 3]])
    masks = {
        "none": None,
        "causal": nn.make_causal_mask(tokens),
        "padding": nn.make_attention_mask(tokens > 0, tokens > 0),  # pad query rows fully masked
    }
    for name, mask in masks.items():
        ours_mask = None if mask is None else mask.astype(bool)
        np.testing.assert_allclose(
            ours.apply(params, x, mask=ours_mask),
            theirs.apply(params, x, mask=mask),
            atol=1e-5,
            err_msg=name,
        )


def test_same_outputs_as_flax_cross_attention_with_other_sizes():
    kwargs = dict(num_heads=2, qkv_features=12, out_features=5, normalize_qk=True)
    theirs, ours = flax_and_ours(**kwargs)
    x_q, x_kv = inputs((2, 3, 16)), inputs((2, 7, 10), seed=1)
    params = theirs.init(KEY, x_q, x_kv)
    mask = attention.make_attention_mask(np.ones((2, 3)), np.array([[1] * 7, [1] * 4 + [0] * 3]))
    np.testing.assert_allclose(
        ours.apply(params, x_q, x_kv, mask=mask), theirs.apply(params, x_q, x_kv, mask=mask), atol=1e-5
    )


def test_dropout_and_sown_weights_match_flax():
    theirs, ours = flax_and_ours(num_heads=4, dropout_rate=0.2)
    x = inputs()
    params = theirs.init(KEY, x, deterministic=True)
    rngs = {"dropout": jax.random.key(5)}
    run = lambda m: m.apply(params, x, deterministic=False, rngs=rngs, sow_weights=True, mutable=["intermediates"])
    (out_a, state_a), (out_b, state_b) = run(ours), run(theirs)
    np.testing.assert_allclose(out_a, out_b, atol=1e-5)
    w_a, w_b = state_a["intermediates"]["attention_weights"][0], state_b["intermediates"]["attention_weights"][0]
    assert w_a.shape == (2, 4, 6, 6)
    np.testing.assert_allclose(w_a, w_b, atol=1e-6)


def test_user_attention_fn_is_called_flax_style():
    theirs, ours = flax_and_ours(num_heads=4, attention_fn=nn.dot_product_attention)
    x = inputs()
    params = theirs.init(KEY, x)
    np.testing.assert_allclose(
        ours.apply(params, x, is_causal=True), theirs.apply(params, x, mask=nn.make_causal_mask(x[..., 0])), atol=1e-5
    )


def test_decode_matches_flax_decode_step_by_step():
    theirs, ours = flax_and_ours(num_heads=4, decode=True)
    x = inputs()
    variables = theirs.init(KEY, x)
    cache_a, cache_b = ours.init(KEY, x)["cache"], variables["cache"]
    for t in range(x.shape[1]):
        out_a, upd_a = ours.apply({"params": variables["params"], "cache": cache_a}, x[:, t : t + 1], mutable=["cache"])
        out_b, upd_b = theirs.apply(
            {"params": variables["params"], "cache": cache_b}, x[:, t : t + 1], mutable=["cache"]
        )
        cache_a, cache_b = upd_a["cache"], upd_b["cache"]
        np.testing.assert_allclose(out_a, out_b, atol=1e-5, err_msg=f"step {t}")


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("chunks", [(1,) * 6, (4, 1, 1), (6,)], ids=["steps", "prefill+steps", "one-call"])
def test_decode_equals_the_full_causal_pass(kv_heads, chunks):
    layer = attention.MultiHeadAttention(num_heads=4, num_kv_heads=kv_heads, decode=True)
    x = inputs()
    variables = layer.init(KEY, x)
    cached_key = variables["cache"]["cached_key"]
    assert cached_key.size + variables["cache"]["cached_value"].size == 2 * 2 * 6 * kv_heads * 4
    full = layer.clone(decode=False).apply({"params": variables["params"]}, x, is_causal=True)
    cache, outs, start = variables["cache"], [], 0
    step = jax.jit(
        lambda cache, x_new: layer.apply(
            {"params": variables["params"], "cache": cache}, x_new, is_causal=True, mutable=["cache"]
        )
    )
    for size in chunks:
        out, updated = step(cache, x[:, start : start + size])
        cache, start = updated["cache"], start + size
        outs.append(out)
    assert int(cache["cache_index"]) == 6
    np.testing.assert_allclose(jnp.concatenate(outs, axis=1), full, atol=1e-5)


def test_decode_through_flaxs_attention_fn_equals_the_full_causal_pass():
    """A user's `attention_fn` (Flax's own here) reads the heads-first cache in Flax's layout, handed over so."""
    layer = attention.MultiHeadAttention(num_heads=4, decode=True, attention_fn=nn.dot_product_attention)
    x = inputs()
    variables = layer.init(KEY, x)
    full = layer.clone(decode=False).apply({"params": variables["params"]}, x, is_causal=True)
    cache, outs = variables["cache"], []
    for t in range(x.shape[1]):
        out, updated = layer.apply({"params": variables["params"], "cache": cache}, x[:, t : t + 1], mutable=["cache"])
        cache = updated["cache"]
        outs.append(out)
    np.testing.assert_allclose(jnp.concatenate(outs, axis=1), full, atol=1e-5)


def test_blockwise_prefill_and_decode_equal_the_full_pass():
    """Blocks (2, 4) do not divide the 6 positions; the cache path masks by position, not by flag."""
    layer = attention.MultiHeadAttention(num_heads=4, num_kv_heads=2, decode=True, impl="blockwise", block_sizes=(2, 4))
    x = inputs()
    variables = layer.init(KEY, x)
    full = layer.clone(decode=False, impl="vmap").apply({"params": variables["params"]}, x, is_causal=True)
    np.testing.assert_allclose(
        layer.clone(decode=False).apply({"params": variables["params"]}, x, is_causal=True), full, atol=1e-5
    )
    cache, outs, start = variables["cache"], [], 0
    for size in (4, 1, 1):
        out, updated = layer.apply(
            {"params": variables["params"], "cache": cache}, x[:, start : start + size], mutable=["cache"]
        )
        cache, start = updated["cache"], start + size
        outs.append(out)
    np.testing.assert_allclose(jnp.concatenate(outs, axis=1), full, atol=1e-5)


def test_donated_decode_step_writes_the_cache_in_place():
    """Under jit with the cache donated, XLA aliases it to the updated cache (else JAX warns and copies)."""
    layer = attention.MultiHeadAttention(num_heads=4, num_kv_heads=2, decode=True)
    variables = layer.init(KEY, inputs((2, 8, 16)))

    def step(cache, token):
        return layer.apply({"params": variables["params"], "cache": cache}, token, mutable=["cache"])

    step = jax.jit(step, donate_argnums=0)
    cache = variables["cache"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Some donated buffers were not usable" would fail here
        _, updated = step(cache, inputs((2, 1, 16)))
    assert cache["cached_key"].is_deleted() and cache["cached_value"].is_deleted()
    assert int(updated["cache"]["cache_index"]) == 1


def test_auto_impl_sows_weights_through_vmap():
    layer = attention.MultiHeadAttention(num_heads=4, impl="auto")
    x = inputs()
    params = layer.init(KEY, x)
    _, state = layer.apply(params, x, sow_weights=True, mutable=["intermediates"])
    _, expected = layer.clone(impl="vmap").apply(params, x, sow_weights=True, mutable=["intermediates"])
    np.testing.assert_allclose(
        state["intermediates"]["attention_weights"][0], expected["intermediates"]["attention_weights"][0]
    )


@pytest.mark.parametrize("impl", ["vmap", "einsum", "xla"])
def test_gqa_layer_matches_numpy(impl):
    layer = attention.MultiHeadAttention(num_heads=4, num_kv_heads=2, impl=impl)
    x_q, x_kv = inputs((2, 3, 16)), inputs((2, 5, 16), seed=1)
    params = jax.tree.map(np.asarray, layer.init(KEY, x_q, x_kv)["params"])
    x_q, x_kv = np.asarray(x_q), np.asarray(x_kv)
    project = lambda x, p: np.einsum("bld,dhk->blhk", x, p["kernel"]) + p["bias"]
    q, k, v = project(x_q, params["query"]), project(x_kv, params["key"]), project(x_kv, params["value"])
    assert k.shape == (2, 5, 2, 4)
    heads, _ = reference.attention(q, k, v)
    expected = np.einsum("blhk,hkd->bld", heads, params["out"]["kernel"]) + params["out"]["bias"]
    np.testing.assert_allclose(layer.apply({"params": params}, x_q, x_kv), expected, atol=1e-5)


def test_head_mask_equals_zeroing_that_heads_rows_of_w_o():
    layer = attention.MultiHeadAttention(num_heads=4, num_kv_heads=2)
    x = inputs()
    params = layer.init(KEY, x)["params"]
    pruned = jax.tree.map(lambda p: p, params)
    pruned["out"] = {**params["out"], "kernel": params["out"]["kernel"].at[2].set(0.0)}
    head_mask = jnp.array([1.0, 1.0, 0.0, 1.0])
    np.testing.assert_allclose(
        layer.apply({"params": params}, x, head_mask=head_mask), layer.apply({"params": pruned}, x), atol=1e-6
    )
    per_example = jnp.array([[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    out = layer.apply({"params": params}, x, head_mask=per_example)
    np.testing.assert_allclose(out[1], layer.apply({"params": params}, x)[1], atol=1e-6)
    np.testing.assert_allclose(out[0], layer.apply({"params": pruned}, x)[0], atol=1e-6)


def test_fused_qkv_equals_separate_projections():
    fused = attention.MultiHeadAttention(num_heads=4, num_kv_heads=2, fused_qkv=True)
    separate = fused.clone(fused_qkv=False)
    x = inputs()
    params = separate.init(KEY, x)["params"]
    qkv = {
        name: jnp.concatenate([params[n][name] for n in ("query", "key", "value")], axis=-2)
        for name in ("kernel", "bias")
    }
    fused_params = {"qkv": qkv, "out": params["out"]}
    assert jax.tree.map(jnp.shape, fused.init(KEY, x)["params"]) == jax.tree.map(jnp.shape, fused_params)
    np.testing.assert_allclose(
        fused.apply({"params": fused_params}, x, is_causal=True),
        separate.apply({"params": params}, x, is_causal=True),
        atol=1e-6,
    )


def test_flax_class_name_keeps_flax_parameter_paths():
    def model(cls):
        class Model(nn.Module):
            @nn.compact
            def __call__(self, x):
                return cls(num_heads=2)(x)

        return Model()

    x = inputs((1, 3, 8))
    flax_params = model(nn.MultiHeadDotProductAttention).init(KEY, x)
    ours = model(attention.MultiHeadDotProductAttention)
    assert list(flax_params["params"]) == ["MultiHeadDotProductAttention_0"]
    assert jax.tree.structure(ours.init(KEY, x)) == jax.tree.structure(flax_params)
    np.testing.assert_allclose(
        ours.apply(flax_params, x), model(nn.MultiHeadDotProductAttention).apply(flax_params, x), atol=1e-6
    )


def test_jit_and_grad_through_the_layer():
    layer = attention.MultiHeadAttention(num_heads=4, num_kv_heads=2)
    x = inputs()
    params = layer.init(KEY, x)["params"]
    loss = jax.jit(jax.value_and_grad(lambda p: jnp.mean(layer.apply({"params": p}, x, is_causal=True) ** 2)))
    value, grads = loss(params)
    eps = 1e-3
    bumped = jax.tree.map(lambda p: p, params)
    bumped["key"] = {**params["key"], "bias": params["key"]["bias"].at[0, 0].add(eps)}
    numeric = (loss(bumped)[0] - value) / eps
    np.testing.assert_allclose(grads["key"]["bias"][0, 0], numeric, rtol=2e-2, atol=1e-4)


def test_bfloat16_layer_runs_with_float32_params():
    layer = attention.MultiHeadAttention(num_heads=4, num_kv_heads=1, dtype=jnp.bfloat16)
    x = inputs()
    params = layer.init(KEY, x)["params"]
    assert jax.tree.leaves(params)[0].dtype == jnp.float32
    out = layer.apply({"params": params}, x)
    reference_out = layer.clone(dtype=jnp.float32).apply({"params": params}, x)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out, np.float32), reference_out, atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize(
    "kwargs, call, message",
    [
        (dict(num_heads=3), {}, r"qkv_features \(16\) must be divisible by num_heads \(3\)"),
        (dict(num_heads=4, num_kv_heads=3), {}, r"num_heads \(4\) must be divisible by num_kv_heads \(3\)"),
        (dict(num_heads=4, impl="flash"), {}, "impl must be one of"),
        (dict(num_heads=4, fused_qkv=True), dict(inputs_k=inputs((2, 5, 16))), "fused_qkv=True"),
        (dict(num_heads=4, impl="xla"), dict(sow_weights=True), "sow_weights=True"),
        (dict(num_heads=4, impl="blockwise"), dict(sow_weights=True), "sow_weights=True"),
        (
            dict(num_heads=4),
            dict(mask=np.ones((2, 3, 6, 6), np.float32)),
            r"mask has shape \(2, 3, 6, 6\), which does not",
        ),
        (dict(num_heads=4), dict(mask=np.ones((2, 3, 6, 6), bool)), "does not broadcast"),
        (dict(num_heads=4), dict(head_mask=np.ones(4, np.int32)), "head_mask must be a float"),
        (dict(num_heads=4), dict(head_mask=np.ones(3, np.float32)), "head_mask has shape"),
        (dict(num_heads=4, qk_attn_weights_einsum_cls=lambda: jnp.einsum), {}, "set attention_fn"),
    ],
)
def test_bad_configurations_raise(kwargs, call, message):
    layer = attention.MultiHeadAttention(**kwargs)
    x = inputs()
    with pytest.raises(ValueError, match=message):
        layer.init(KEY, x, **call)


def test_decode_rejects_more_tokens_than_the_cache_holds():
    layer = attention.MultiHeadAttention(num_heads=4, decode=True)
    variables = layer.init(KEY, inputs((2, 3, 16)))
    with pytest.raises(ValueError, match="the cache holds 3 positions"):
        layer.apply(variables, inputs((2, 4, 16)), mutable=["cache"])


@pytest.mark.parametrize("impl", ["vmap", "einsum", "blockwise"])
def test_value_head_dim_differs_from_key_head_dim(impl):
    """d_k = 16 / 4 = 4, d_v = 6: value kernel [D, G, d_v], out kernel [H, d_v, D]; NumPy reference."""
    layer = attention.MultiHeadAttention(num_heads=4, num_kv_heads=2, v_head_dim=6, impl=impl)
    x_q, x_kv = inputs((2, 3, 16)), inputs((2, 5, 16), seed=1)
    params = jax.tree.map(np.asarray, layer.init(KEY, x_q, x_kv)["params"])
    assert params["key"]["kernel"].shape == (16, 2, 4)
    assert params["value"]["kernel"].shape == (16, 2, 6)
    assert params["out"]["kernel"].shape == (4, 6, 16)
    x_q, x_kv = np.asarray(x_q, np.float64), np.asarray(x_kv, np.float64)
    project = lambda x, p: np.einsum("bld,dhk->blhk", x, p["kernel"]) + p["bias"]
    q, k, v = project(x_q, params["query"]), project(x_kv, params["key"]), project(x_kv, params["value"])
    mask = np.array([[1] * 5, [1] * 3 + [0] * 2], bool)[:, None, None, :]
    heads, _ = reference.attention(q, k, v, mask=mask)
    assert heads.shape == (2, 3, 4, 6)
    expected = np.einsum("blhk,hkd->bld", heads, params["out"]["kernel"]) + params["out"]["bias"]
    np.testing.assert_allclose(layer.apply({"params": params}, x_q, x_kv, mask=mask), expected, atol=1e-5)


@pytest.mark.parametrize("kv_heads", [4, 1])
def test_decode_equals_the_full_pass_with_value_head_dim(kv_heads):
    layer = attention.MultiHeadAttention(num_heads=4, num_kv_heads=kv_heads, v_head_dim=3, decode=True)
    x = inputs()
    variables = layer.init(KEY, x)
    assert variables["cache"]["cached_key"].shape == (2, kv_heads, 6, 4)
    assert variables["cache"]["cached_value"].shape == (2, kv_heads, 6, 3)
    full = layer.clone(decode=False).apply({"params": variables["params"]}, x, is_causal=True)
    cache, outs, start = variables["cache"], [], 0
    for size in (3, 1, 1, 1):
        out, updated = layer.apply(
            {"params": variables["params"], "cache": cache}, x[:, start : start + size], mutable=["cache"]
        )
        cache, start = updated["cache"], start + size
        outs.append(out)
    np.testing.assert_allclose(jnp.concatenate(outs, axis=1), full, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(impl="xla"), "v_head_dim"),
        (dict(fused_qkv=True), "v_head_dim = 8; fused_qkv=True"),
        (dict(v_head_dim=0), "MultiHeadAttention.v_head_dim = 0; expected None or a positive int"),
    ],
)
def test_bad_value_head_dims_raise(kwargs, message):
    layer = attention.MultiHeadAttention(num_heads=4, **{"v_head_dim": 8, **kwargs})
    with pytest.raises(ValueError, match=message):
        layer.init(KEY, inputs())


@pytest.mark.parametrize("decode", [False, True])
def test_cache_cross_kv_stores_the_source_projections_once_and_reuses_them(decode):
    """`decode` changes nothing on a `cache_cross_kv` layer: its decode state is the kept source."""
    x, source, other = inputs((2, 3, 16)), inputs((2, 5, 16), seed=1), inputs((2, 5, 16), seed=2)
    cross = attention.MultiHeadAttention(num_heads=4, num_kv_heads=2, cache_cross_kv=True, decode=decode)
    variables = cross.init(KEY, x, source)
    assert "cache" not in variables  # init's inputs are placeholders: nothing is kept
    params = variables["params"]
    plain = attention.MultiHeadAttention(num_heads=4, num_kv_heads=2)
    first, state = cross.apply({"params": params}, x, source, mutable=["cache"])
    cache = state["cache"]
    for name in ("key", "value"):  # x W + b, in NumPy
        p = params[name]
        want = np.einsum("bld,dgk->blgk", np.asarray(source), np.asarray(p["kernel"])) + np.asarray(p["bias"])
        np.testing.assert_allclose(
            cache[f"cross_{name}"], want.transpose(0, 2, 1, 3), rtol=1e-5, atol=1e-5
        )  # head-first
    np.testing.assert_allclose(first, plain.apply({"params": params}, x, source), atol=1e-6)
    # a later step reads the cache: another source is not read, the first one's answer comes back
    later = cross.apply({"params": params, "cache": cache}, x, other)
    np.testing.assert_allclose(later, plain.apply({"params": params}, x, source), atol=1e-6)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_kv_heads=2, attention_type="entmax"),  # reads the stored source heads-first, as it is
        dict(num_kv_heads=2, attention_type="linformer", attention_options=dict(max_length=8, projected_length=4)),
        dict(attention_fn=nn.dot_product_attention),  # Flax's function: handed Flax's layout
    ],
    ids=["entmax", "linformer", "attention_fn"],
)
def test_cache_cross_kv_serves_family_members_and_attention_fn_as_the_plain_layer(kwargs):
    """The stored source is heads-first; whatever reads it gives the answer of the layer without the store."""
    x, source, other = inputs((2, 3, 16)), inputs((2, 5, 16), seed=1), inputs((2, 5, 16), seed=2)
    cross = attention.MultiHeadAttention(num_heads=4, cache_cross_kv=True, **kwargs)
    params = cross.init(KEY, x, source)["params"]
    want = attention.MultiHeadAttention(num_heads=4, **kwargs).apply({"params": params}, x, source)
    first, state = cross.apply({"params": params}, x, source, mutable=["cache"])
    later = cross.apply({"params": params, "cache": state["cache"]}, x, other)  # `other` is not read
    np.testing.assert_allclose(first, want, atol=1e-6)
    np.testing.assert_allclose(later, want, atol=1e-6)


def test_per_sequence_index_decodes_ragged_prompts_as_the_full_causal_pass():
    """`per_sequence_index=True`: cache_index [B], a ragged prefill with `lengths`, then steps; each real
    position's output equals the full causal pass at that position (the NNX layer's protocol, on Linen)."""
    x, prompts = inputs((3, 8, 16)), np.array([2, 5, 3])
    layer = attention.MultiHeadAttention(num_heads=4, num_kv_heads=2, decode=True, per_sequence_index=True)
    variables = layer.init(KEY, x)
    assert variables["cache"]["cache_index"].shape == (3,)
    params = {"params": variables["params"]}
    full = layer.clone(decode=False).apply(params, x, is_causal=True)
    prompt = jnp.where(jnp.arange(5)[None, :, None] < prompts[:, None, None], x[:, :5], 0.0)  # right-padded
    out, state = layer.apply(
        {**params, "cache": variables["cache"]}, prompt, lengths=jnp.asarray(prompts), mutable=["cache"]
    )
    for b, n in enumerate(prompts):
        np.testing.assert_allclose(out[b, :n], full[b, :n], atol=1e-5, err_msg=f"prefill, sequence {b}")
    np.testing.assert_array_equal(state["cache"]["cache_index"], prompts)
    for _ in range(2):  # one token per sequence, each at its own position
        positions = np.asarray(state["cache"]["cache_index"])
        step = x[np.arange(3), positions][:, None]
        out, state = layer.apply({**params, **state}, step, mutable=["cache"])
        np.testing.assert_allclose(out[:, 0], full[np.arange(3), positions], atol=1e-5, err_msg=f"at {positions}")
    np.testing.assert_array_equal(state["cache"]["cache_index"], prompts + 2)


def test_lengths_needs_decode_and_a_per_sequence_index():
    x = inputs((2, 4, 16))
    flax_style = attention.MultiHeadAttention(num_heads=4, decode=True)
    variables = flax_style.init(KEY, x)
    with pytest.raises(ValueError, match="lengths must be ints of shape"):  # one index for the batch
        flax_style.apply(variables, x[:, :2], lengths=jnp.array([2, 1]), mutable=["cache"])
    plain = attention.MultiHeadAttention(num_heads=4)
    with pytest.raises(ValueError, match="lengths is a decode argument"):
        plain.apply(plain.init(KEY, x), x, lengths=jnp.array([2, 1]))
