"""`models.Transformer`: config checks, hand-counted parameters, causality, padding, the decode cache."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models
from tiny import model_config

KEY = jax.random.key(0)
SRC = jnp.array([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]], jnp.int32)
TGT_IN = jnp.array([[2, 7, 3, 9, 4, 0, 0], [2, 15, 16, 17, 18, 19, 4]], jnp.int32)


tiny = model_config  # d_model 32, 4 heads, 2 layers (tests/tiny.py); tests name what they change


def init(config, src=SRC, tgt=TGT_IN):
    model = models.Transformer(config)
    return model, model.init(KEY, src, tgt)


@pytest.mark.parametrize(
    "overrides, field, shown",
    [
        (dict(vocab_size=0), "vocab_size", "0"),
        (dict(d_model=30, num_heads=4), "d_model", "30"),
        (dict(num_heads=4, num_kv_heads=3), "num_kv_heads", "3"),
        (dict(num_kv_heads=0), "num_kv_heads", "0"),
        (dict(head_dim=-1), "head_dim", "-1"),
        (dict(activation="swish"), "activation", "'swish'"),
        (dict(pre_ln=1), "pre_ln", "1"),
        (dict(dropout_rate=1.0), "dropout_rate", "1.0"),
        (dict(attention_dropout_rate=-0.1), "attention_dropout_rate", "-0.1"),
        (dict(num_layers=0), "num_layers", "0"),
        (dict(attention_impl="flash"), "attention_impl", "'flash'"),
        (dict(dot_general="yes"), "dot_general", "'yes'"),
        (dict(eos_id=20), "eos_id", "20"),
        (dict(bos_id=0), "pad_id/eos_id/bos_id", "(0, 1, 0)"),
    ],
)
def test_config_validation_names_the_field_and_value(overrides, field, shown):
    with pytest.raises(ValueError, match=re.escape(f"TransformerConfig.{field} = {shown}; expected")):
        tiny(**overrides)


def test_head_dim_decouples_qkv_width_from_d_model():
    assert tiny(d_model=30, num_heads=4, head_dim=8).qkv_features == 32
    assert tiny().qkv_features == 32


def test_sinusoidal_positions_follow_vaswani():
    table = models.sinusoidal_positions(50, 6)
    for pos in (0, 1, 7, 49):
        for i in range(3):
            angle = pos / 10000 ** (2 * i / 6)
            assert table[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-6)
    assert models.sinusoidal_positions(4, 5).shape == (4, 5)  # odd widths end on a sine


def hand_count(D, H, G, Dk, F, V, N, pre_ln, tied):
    attn = (D * H * Dk + H * Dk) + 2 * (D * G * Dk + G * Dk) + (H * Dk * D + D)
    mlp = (D * F + F) + (F * D + D)
    ln = 2 * D
    encoder_layer, decoder_layer = attn + mlp + 2 * ln, 2 * attn + mlp + 3 * ln
    return V * D + N * (encoder_layer + decoder_layer) + (2 * ln if pre_ln else 0) + (0 if tied else D * V + V)


def count(config):
    shapes = jax.eval_shape(models.Transformer(config).init, KEY, SRC, TGT_IN)
    return sum(math.prod(p.shape) for p in jax.tree.leaves(shapes["params"]))


@pytest.mark.parametrize("pre_ln", [True, False])
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("kv_heads, head_dim", [(None, None), (2, None), (1, 6)])
def test_parameter_count_matches_hand_count(pre_ln, tied, kv_heads, head_dim):
    config = tiny(pre_ln=pre_ln, tie_embeddings=tied, num_kv_heads=kv_heads, head_dim=head_dim)
    G, Dk = kv_heads or 4, head_dim or 8
    assert count(config) == hand_count(32, 4, G, Dk, 48, 20, 2, pre_ln, tied)


def test_gqa_shrinks_only_the_key_value_kernels():
    mha = jax.eval_shape(models.Transformer(tiny()).init, KEY, SRC, TGT_IN)["params"]
    mqa = jax.eval_shape(models.Transformer(tiny(num_kv_heads=1)).init, KEY, SRC, TGT_IN)["params"]
    for attn in ("self_attention", "cross_attention"):
        layer_mha, layer_mqa = mha["decoder"]["layer_1"][attn], mqa["decoder"]["layer_1"][attn]
        assert layer_mha["key"]["kernel"].shape == layer_mha["value"]["kernel"].shape == (32, 4, 8)
        assert layer_mqa["key"]["kernel"].shape == layer_mqa["value"]["kernel"].shape == (32, 1, 8)
        assert layer_mqa["query"]["kernel"].shape == layer_mqa["query"]["kernel"].shape == (32, 4, 8)
    # 3 attention layers per encoder+decoder layer pair, K and V each lose (H - G) heads of Dk (+ bias)
    assert count(tiny()) - count(tiny(num_kv_heads=1)) == 2 * 3 * 2 * (32 * 3 * 8 + 3 * 8)


def test_scale_out_init_scales_exactly_the_output_kernels():
    _, plain = init(tiny())
    _, scaled = init(tiny(scale_out_init=True))
    flat_plain = dict(jax.tree_util.tree_flatten_with_path(plain)[0])
    for path, leaf in jax.tree_util.tree_flatten_with_path(scaled)[0]:
        name = jax.tree_util.keystr(path)
        is_out = name.endswith("['out']['kernel']") or name.endswith("['wo']['kernel']")
        factor = 1 / math.sqrt(2 * 2) if is_out else 1.0
        np.testing.assert_allclose(leaf, factor * flat_plain[path], rtol=1e-6, err_msg=name)


@pytest.mark.parametrize("pre_ln", [True, False])
def test_changing_future_target_tokens_leaves_earlier_logits_unchanged(pre_ln):
    model, variables = init(tiny(pre_ln=pre_ln, num_kv_heads=2))
    logits = model.apply(variables, SRC, TGT_IN)
    rng = np.random.default_rng(0)
    for i in range(TGT_IN.shape[1] - 1):
        changed = np.array(TGT_IN)
        changed[:, i + 1 :] = rng.integers(3, 20, size=changed[:, i + 1 :].shape)
        changed_logits = model.apply(variables, SRC, jnp.asarray(changed))
        np.testing.assert_allclose(changed_logits[:, : i + 1], logits[:, : i + 1], atol=1e-6)
        assert not np.allclose(changed_logits[:, i + 1], logits[:, i + 1], atol=1e-3)  # the test can see a change


@pytest.mark.parametrize("pre_ln", [True, False])
def test_source_padding_is_invisible(pre_ln):
    """Row 0 of SRC is a 4-token sentence plus 2 pads: it must encode and decode as the bare sentence."""
    model, variables = init(tiny(pre_ln=pre_ln))
    bare = SRC[:, :4]  # row 0 without its pads (row 1 is cut too, and not compared)
    padded_encoded = model.apply(variables, SRC, method=models.Transformer.encode)
    bare_encoded = model.apply(variables, bare, method=models.Transformer.encode)
    np.testing.assert_allclose(padded_encoded[0, :4], bare_encoded[0], atol=1e-5)
    padded_logits = model.apply(variables, SRC, TGT_IN)
    np.testing.assert_allclose(padded_logits[0], model.apply(variables, bare, TGT_IN)[0], atol=1e-5)
    seen = model.apply(variables, SRC.at[0, 4].set(3), TGT_IN)
    assert not np.allclose(seen[0], padded_logits[0], atol=1e-3)  # a real token in that slot is seen


@pytest.mark.parametrize("pre_ln", [True, False])
@pytest.mark.parametrize("kv_heads", [None, 2])
def test_cached_decoding_matches_the_full_pass(pre_ln, kv_heads):
    model, variables = init(tiny(pre_ln=pre_ln, num_kv_heads=kv_heads))
    full = model.apply(variables, SRC, TGT_IN)
    encoded = model.apply(variables, SRC, method=models.Transformer.encode)

    def decode(cache, tokens):
        return model.apply(
            {**variables, "cache": cache},
            encoded,
            SRC,
            tokens,
            method=models.Transformer.decode,
            decode=True,
            mutable=["cache"],
        )

    length = TGT_IN.shape[1]
    for chunks in ([1] * length, [3, 1, 2, 1]):  # token by token; prefill then mixed steps
        cache = models.init_cache(model, variables["params"], encoded, SRC, length)
        start, pieces = 0, []
        for size in chunks:
            logits, state = decode(cache, TGT_IN[:, start : start + size])
            cache, start = state["cache"], start + size
            pieces.append(logits)
        np.testing.assert_allclose(jnp.concatenate(pieces, axis=1), full, atol=1e-5)
        assert int(cache["decoder"]["position"]) == length
        assert int(cache["decoder"]["layer_0"]["self_attention"]["cache_index"]) == length
        cross_key = cache["decoder"]["layer_0"]["cross_attention"]["cross_key"]  # source K/V kept, head-first
        assert (cross_key.shape[0], cross_key.shape[2]) == SRC.shape


def test_dropout_only_in_training():
    model, variables = init(tiny(dropout_rate=0.3, attention_dropout_rate=0.2))
    evaluation = model.apply(variables, SRC, TGT_IN)
    np.testing.assert_array_equal(model.apply(variables, SRC, TGT_IN), evaluation)
    train = [model.apply(variables, SRC, TGT_IN, train=True, rngs={"dropout": jax.random.key(s)}) for s in (1, 2)]
    assert not np.allclose(train[0], evaluation, atol=1e-3)
    assert not np.allclose(train[0], train[1], atol=1e-3)


def test_logits_are_float32_with_bfloat16_compute():
    model, variables = init(tiny(dtype=jnp.bfloat16))
    assert model.apply(variables, SRC, TGT_IN).dtype == jnp.float32


@pytest.mark.parametrize(
    "src, tgt, message",
    [
        (SRC.astype(jnp.float32), TGT_IN, "src_tokens must be int"),
        (SRC[0], TGT_IN, "src_tokens must be int tokens \\[batch, length\\]"),
        (SRC, jnp.zeros((2, 17), jnp.int32), "tgt_in_tokens has length 17 > config.max_len"),
    ],
)
def test_bad_token_arrays_raise(src, tgt, message):
    model, variables = init(tiny())
    with pytest.raises(ValueError, match=message):
        model.apply(variables, src, tgt)


def test_weights_are_recorded_only_where_intermediates_is_mutable_and_never_by_init():
    _, variables = init(tiny(attention_impl="xla"))  # xla cannot return weights: init must not ask for them
    assert set(variables) == {"params"}
    model, variables = init(tiny())
    assert not isinstance(model.apply(variables, SRC, TGT_IN), tuple)
    _, state = model.apply(variables, SRC, TGT_IN, mutable=["intermediates"])
    decoder_layer = state["intermediates"]["decoder"]["layer_1"]
    assert sorted(decoder_layer) == ["cross_attention", "self_attention"]
    assert decoder_layer["cross_attention"]["attention_weights"][0].shape == (2, 4, 7, 6)  # [B, H, Lt, Ls]


@pytest.mark.parametrize("pre_ln", [True, False])
def test_a_packed_row_computes_each_pair_as_if_alone(pre_ln):
    """Row 0 packs pair A (source 3 tokens, target 4) then pair B (2, 3), as training.data.batching lays them out."""
    model, variables = init(tiny(pre_ln=pre_ln))
    src_a, tgt_a, src_b, tgt_b = [5, 6, 7], [2, 8, 9, 10], [11, 12], [2, 13, 14]
    packed = dict(
        src_tokens=jnp.array([src_a + src_b + [0]]),
        tgt_in_tokens=jnp.array([tgt_a + tgt_b + [0]]),
        src_segments=jnp.array([[1, 1, 1, 2, 2, 0]]),
        tgt_segments=jnp.array([[1, 1, 1, 1, 2, 2, 2, 0]]),
        src_positions=jnp.array([[0, 1, 2, 0, 1, 0]]),
        tgt_positions=jnp.array([[0, 1, 2, 3, 0, 1, 2, 0]]),
    )
    logits = model.apply(variables, **packed)
    alone_a = model.apply(variables, jnp.array([src_a]), jnp.array([tgt_a]))
    alone_b = model.apply(variables, jnp.array([src_b]), jnp.array([tgt_b]))
    np.testing.assert_allclose(logits[0, :4], alone_a[0], atol=1e-5)
    np.testing.assert_allclose(logits[0, 4:7], alone_b[0], atol=1e-5)
    assert np.isfinite(logits).all()  # the padding query sees no key of its segment in the source: still finite
    unpacked = model.apply(variables, packed["src_tokens"], packed["tgt_in_tokens"])
    assert not np.allclose(unpacked[0, 4:7], alone_b[0], atol=1e-3)  # without segments, B would see A


def test_packing_arguments_come_all_together_in_their_tokens_shape():
    model, variables = init(tiny())
    segments = jnp.ones_like(SRC)
    with pytest.raises(ValueError, match="need all of .*got only \\['src_segments'\\]"):
        model.apply(variables, SRC, TGT_IN, src_segments=segments)
    with pytest.raises(
        ValueError, match=re.escape("tgt_positions has shape (2, 6); expected its tokens' shape (2, 7)")
    ):
        model.apply(
            variables,
            SRC,
            TGT_IN,
            src_segments=segments,
            tgt_segments=jnp.ones_like(TGT_IN),
            src_positions=segments,
            tgt_positions=segments,
        )


def test_attention_bias_off_leaves_the_projections_without_biases_and_nothing_else_changes():
    tokens = jnp.ones((1, 4), jnp.int32)
    shapes = {}
    for bias in (True, False):
        model = models.Transformer(model_config(d_model=16, num_heads=2, num_layers=1, mlp_dim=24, attention_bias=bias))
        params = jax.eval_shape(lambda m=model: m.init(jax.random.key(0), tokens, tokens)["params"])
        shapes[bias] = {
            "/".join(str(k.key) for k in path): leaf.shape for path, leaf in jax.tree_util.tree_leaves_with_path(params)
        }
    dropped = set(shapes[True]) - set(shapes[False])
    # q, k, v and out biases of the encoder's self-attention and the decoder's two attentions
    assert len(dropped) == 3 * 4 and all(name.endswith("bias") and "attention" in name for name in dropped), sorted(
        dropped
    )
    assert {n: s for n, s in shapes[True].items() if n not in dropped} == shapes[False]
