"""Head gates: a zero gate is a head with zeroed W^O rows; importance through the gates."""

import jax
import numpy as np
import pytest

from analysis import heads, importance
from models import Transformer, head_mask_variables
from tiny import model_config
from training.core import step as step_lib

CONFIG = model_config(vocab_size=32, d_model=16, mlp_dim=32)


@pytest.fixture(scope="module")
def setup():
    model = Transformer(CONFIG)
    rng = np.random.default_rng(0)
    src = rng.integers(3, 32, (3, 7)).astype(np.int32)
    tgt = rng.integers(3, 32, (3, 6)).astype(np.int32)
    src[1, 5:], tgt[2, 4:] = 0, 0  # some padding
    tgt_in = np.concatenate([np.full((3, 1), 2, np.int32), tgt[:, :-1]], axis=1)
    batch = {"src": src, "tgt_in": tgt_in, "tgt_out": tgt, "weights": (tgt != 0).astype(np.float32)}
    params = jax.jit(model.init)(jax.random.key(0), src, tgt_in)["params"]
    params = jax.tree.map(
        lambda x: x + 0.1 * rng.standard_normal(x.shape).astype(np.float32), params
    )  # non-zero biases
    return model, params, batch


@pytest.fixture(scope="module")
def forward(setup):
    model = setup[0]
    return jax.jit(
        lambda params, src, tgt_in, mask=None: model.apply(
            {"params": params, **head_mask_variables(CONFIG, mask)}, src, tgt_in
        )
    )


def without_rows(params, stack, module, layer, head):
    """An independent copy of params with one head's W^O rows set to zero (NumPy assignment)."""
    params = jax.tree.map(np.array, params)
    params[stack][f"layer_{layer}"][module]["out"]["kernel"][head] = 0.0
    return params


@pytest.mark.parametrize("kind", list(heads.MODULES))
def test_a_zero_gate_equals_zeroed_out_rows(setup, forward, kind):
    model, params, batch = setup
    stack, module = heads.MODULES[kind]
    closed = {kind: np.ones((2, 4), np.float32)}
    closed[kind][1, 2] = 0.0
    gated = forward(params, batch["src"], batch["tgt_in"], closed)
    zeroed = forward(without_rows(params, stack, module, 1, 2), batch["src"], batch["tgt_in"])
    np.testing.assert_allclose(gated, zeroed, rtol=1e-6, atol=1e-6)
    full = forward(params, batch["src"], batch["tgt_in"])
    assert np.abs(np.asarray(full) - np.asarray(gated)).max() > 1e-3  # the head mattered
    pruned = heads.zero_heads(params, heads.mask_without(CONFIG, [(kind, 1, 2)]))
    for a, b in zip(jax.tree.leaves(pruned), jax.tree.leaves(without_rows(params, stack, module, 1, 2))):
        np.testing.assert_array_equal(a, b)


def test_gates_per_sentence_and_bad_keys(setup, forward):
    model, params, batch = setup
    gates = np.ones((2, 3, 4), np.float32)
    gates[0, 1, 3] = 0.0  # sentence 1 only
    out = forward(params, batch["src"], batch["tgt_in"], {"decoder_cross": gates})
    zeroed = forward(without_rows(params, "decoder", "cross_attention", 0, 3), batch["src"], batch["tgt_in"])
    np.testing.assert_allclose(out[1], zeroed[1], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out[0], forward(params, batch["src"], batch["tgt_in"])[0], rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="head_mask keys"):
        head_mask_variables(model.config, {"encoder": gates})
    with pytest.raises(ValueError, match="num_layers=2"):
        head_mask_variables(model.config, {"encoder_self": np.ones((3, 4))})


def test_importance_of_a_zeroed_head_is_zero(setup):
    model, params, batch = setup
    silent = without_rows(params, "encoder", "self_attention", 1, 1)
    scores = importance.raw_importance(model, silent, [batch])
    assert scores["encoder_self"][1, 1] == 0.0
    assert all((v > 0).sum() == v.size - (k == "encoder_self") for k, v in scores.items())


def test_importance_matches_the_out_kernel_identity(setup):
    """d L / d xi_h = <dL/dW^O_h, W^O_h> (the gate scales head h's rows), per sentence, by parameter gradients."""
    model, params, batch = setup
    scores = importance.raw_importance(model, params, [batch])

    def loss(p, sub):
        logits = model.apply({"params": p}, sub["src"], sub["tgt_in"])
        return step_lib.token_losses(logits, sub["tgt_out"], sub["weights"], 0.0)[1]

    expected = np.zeros((2, 4))
    grad = jax.jit(jax.grad(loss))
    for row in range(3):
        grads = grad(params, {k: v[row : row + 1] for k, v in batch.items()})
        for layer in range(2):
            g = grads["decoder"][f"layer_{layer}"]["cross_attention"]["out"]["kernel"]
            w = params["decoder"][f"layer_{layer}"]["cross_attention"]["out"]["kernel"]
            expected[layer] += np.abs(np.sum(np.asarray(g) * np.asarray(w), axis=(1, 2)))
    expected /= batch["weights"].sum()
    np.testing.assert_allclose(scores["decoder_cross"], expected, rtol=1e-4)
    normalised = importance.normalise_per_layer(scores)["decoder_cross"]
    np.testing.assert_allclose(np.linalg.norm(normalised, axis=1), 1.0, rtol=1e-6)


def test_sown_weights_are_distributions(setup):
    model, params, batch = setup
    weights = heads.attention_weights(model, params, batch["src"], batch["tgt_in"])
    assert weights["encoder_self"].shape == (2, 3, 4, 7, 7) and weights["decoder_cross"].shape == (2, 3, 4, 6, 7)
    for w in weights.values():
        np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)
    causal = weights["decoder_self"]
    assert np.all(causal[..., np.triu_indices(6, 1)[0], np.triu_indices(6, 1)[1]] == 0.0)
