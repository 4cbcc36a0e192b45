"""MHA -> GQA conversion: with identical heads in each group, mean-pooling changes nothing."""

import dataclasses
import functools

import jax
import numpy as np
import optax
import pytest
from flax.training import train_state

from analysis import uptrain
from models import Transformer, greedy_decode
from tiny import model_config

MHA = model_config(vocab_size=32, d_model=16, mlp_dim=32)


@functools.lru_cache
def tied_mha_params(group):
    """MHA params whose K/V heads are equal within each group of `group` consecutive heads."""
    rng = np.random.default_rng(0)
    tokens = np.ones((1, 3), np.int32)
    params = jax.jit(Transformer(MHA).init)(jax.random.key(0), tokens, tokens)["params"]

    def tie(path, x):
        names = [p.key for p in path if isinstance(p, jax.tree_util.DictKey)]
        x = np.array(x) + 0.1 * rng.standard_normal(x.shape).astype(np.float32)  # non-zero biases too
        if names[-2] in ("key", "value"):
            leaders = x[..., ::group, :]
            x = np.repeat(leaders, group, axis=-2)
        return x

    return jax.tree_util.tree_map_with_path(tie, params)


@pytest.mark.parametrize("num_kv_heads", [2, 1])
def test_mean_pooling_identical_heads_reproduces_the_mha_model(num_kv_heads):
    params = tied_mha_params(4 // num_kv_heads)
    gqa = Transformer(dataclasses.replace(MHA, num_kv_heads=num_kv_heads))
    converted = uptrain.convert_kv(params, 4, num_kv_heads, "mean")
    assert converted["encoder"]["layer_0"]["self_attention"]["key"]["kernel"].shape == (16, num_kv_heads, 4)
    assert converted["decoder"]["layer_1"]["cross_attention"]["value"]["bias"].shape == (num_kv_heads, 4)
    src = np.random.default_rng(1).integers(3, 32, (2, 7)).astype(np.int32)
    src[1, 5:] = 0
    tgt_in = np.random.default_rng(2).integers(3, 32, (2, 5)).astype(np.int32)
    forward = lambda model: jax.jit(lambda p: model.apply({"params": p}, src, tgt_in))
    mha_out = forward(Transformer(MHA))(params)
    np.testing.assert_allclose(forward(gqa)(converted), mha_out, rtol=1e-5, atol=1e-5)
    # the decode cache path too: the same greedy tokens
    decode = lambda model: jax.jit(lambda p: greedy_decode(model, p, src, 8))
    np.testing.assert_array_equal(decode(gqa)(converted), decode(Transformer(MHA))(params))


def test_conversion_methods_on_distinct_heads():
    params = jax.tree.map(np.asarray, tied_mha_params(1))  # all heads distinct
    kernel = params["encoder"]["layer_0"]["self_attention"]["key"]["kernel"]  # [D, 4, Dk]
    mean = uptrain.convert_kv(params, 4, 2, "mean")["encoder"]["layer_0"]["self_attention"]["key"]["kernel"]
    first = uptrain.convert_kv(params, 4, 2, "first")["encoder"]["layer_0"]["self_attention"]["key"]["kernel"]
    np.testing.assert_allclose(mean[:, 1], (kernel[:, 2] + kernel[:, 3]) / 2, rtol=1e-6)
    np.testing.assert_array_equal(first[:, 1], kernel[:, 2])
    query = uptrain.convert_kv(params, 4, 2, "mean")["encoder"]["layer_0"]["self_attention"]["query"]["kernel"]
    np.testing.assert_array_equal(query, params["encoder"]["layer_0"]["self_attention"]["query"]["kernel"])
    with pytest.raises(ValueError, match="must divide"):
        uptrain.convert_kv(params, 4, 3, "mean")


def test_convert_state_carries_adam_moments_and_the_step():
    params = tied_mha_params(1)
    tx = optax.adam(1e-3)
    state = train_state.TrainState.create(apply_fn=None, params=params, tx=tx).replace(step=7)
    state = state.replace(opt_state=jax.tree.map(lambda x: x + 1.0 if x.ndim else x, state.opt_state))
    gqa = Transformer(dataclasses.replace(MHA, num_kv_heads=2))
    fresh = jax.jit(gqa.init)(jax.random.key(5), np.ones((1, 3), np.int32), np.ones((1, 3), np.int32))["params"]
    rand = uptrain.convert_state(state, 4, 2, "random", fresh)
    path = lambda tree: tree["decoder"]["layer_0"]["self_attention"]["value"]["kernel"]
    np.testing.assert_array_equal(path(rand.params), path(fresh))
    mu = rand.opt_state[0].mu
    assert path(mu).shape == (16, 2, 4) and not np.any(path(mu))
    assert rand.step == 7 and rand.opt_state[0].count is state.opt_state[0].count
    mean = uptrain.convert_state(state, 4, 2, "mean")
    np.testing.assert_allclose(path(mean.opt_state[0].nu), 1.0)
    expected = jax.tree.structure(train_state.TrainState.create(apply_fn=None, params=fresh, tx=tx).opt_state)
    assert jax.tree.structure(mean.opt_state) == expected
