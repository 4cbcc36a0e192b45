"""`TransformerConfig.attention_type`: where each member serves, causality, and decoding with its cache."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models
from tiny import model_config
from models import decoding

KEY = jax.random.key(0)
SRC = jnp.array([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]], jnp.int32)
TGT_IN = jnp.array([[2, 7, 3, 9, 4, 0, 0], [2, 15, 16, 17, 18, 19, 4]], jnp.int32)
OPTIONS = {"linformer": {"max_length": 16}, "span": {"max_span": 4, "ramp": 2}}


def tiny(attention_type, **overrides):
    fields = dict(
        d_model=16,
        num_heads=2,
        num_layers=1,
        mlp_dim=16,
        attention_type=attention_type,
        attention_options=OPTIONS.get(attention_type, {}),
    )
    return model_config(**{**fields, **overrides})


@pytest.mark.parametrize(
    "attention_type, encoder_self, decoder_self, cross",
    [("linformer", True, False, True), ("span", True, True, False)],
)
def test_a_member_serves_the_sublayers_it_supports(attention_type, encoder_self, decoder_self, cross):
    params = models.Transformer(tiny(attention_type)).init(KEY, SRC, TGT_IN)["params"]
    has = lambda stack, module: attention_type in params[stack]["layer_0"][module]
    assert (has("encoder", "self_attention"), has("decoder", "self_attention"), has("decoder", "cross_attention")) == (
        encoder_self,
        decoder_self,
        cross,
    )


@pytest.mark.parametrize("attention_type", ["performer", "entmax", "span", "mla"])
def test_future_target_tokens_do_not_change_earlier_logits(attention_type):
    model = models.Transformer(tiny(attention_type))
    params = model.init(KEY, SRC, TGT_IN)
    changed = TGT_IN.at[:, 4:].set(11)
    a, b = (np.asarray(model.apply(params, SRC, t)) for t in (TGT_IN, changed))
    np.testing.assert_allclose(a[:, :4], b[:, :4], atol=1e-5)
    assert not np.allclose(a[:, 4:], b[:, 4:])


@pytest.mark.parametrize("attention_type", ["performer", "mla"])  # over the KV cache: test_family_span.py
def test_cached_decoding_equals_the_full_pass(attention_type):
    model = models.Transformer(tiny(attention_type))
    params = model.init(KEY, SRC, TGT_IN)["params"]
    full = model.apply({"params": params}, SRC, TGT_IN)
    encoded = model.apply({"params": params}, SRC, method="encode")
    cache = decoding.init_cache(model, params, encoded, SRC, TGT_IN.shape[1])
    steps = []
    for t in range(TGT_IN.shape[1]):
        logits, upd = model.apply(
            {"params": params, "cache": cache},
            encoded,
            SRC,
            TGT_IN[:, t : t + 1],
            method="decode",
            decode=True,
            mutable=["cache"],
        )
        cache = upd["cache"]
        steps.append(logits)
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(attention_type="flash"), "TransformerConfig.attention_type = 'flash'; expected one of"),
        (dict(attention_type="performer", attention_options={"k": 1}), "TransformerConfig.attention_options = "),
    ],
)
def test_config_validation_names_the_field(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        tiny(**{"attention_type": "softmax", **overrides})
