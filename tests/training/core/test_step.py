"""`training.core.step`: token_losses against a NumPy cross-entropy with explicitly smoothed labels (both ways of
reading the targets' logits: the plain masked sum and XLA:CPU's gather); packed batches."""

import jax
import numpy as np
import optax
import pytest

from backends import xla_cpu
from models import Transformer
from tiny import model_config
from training.core import step as step_lib
from training.data.batching import BatchSchedule, as_arrays


def numpy_losses(logits, targets, weights, smoothing):
    logits = logits.astype(np.float64)
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    vocab = logits.shape[-1]
    labels = np.full(logits.shape, smoothing / vocab)
    np.put_along_axis(labels, targets[..., None], 1 - smoothing + smoothing / vocab, axis=-1)
    smoothed = -(labels * log_probs).sum(-1)
    nll = -np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    return (smoothed * weights).sum(), (nll * weights).sum(), weights.sum()


PICKS = pytest.mark.parametrize("pick", [None, xla_cpu.target_logits], ids=["masked_sum", "gather"])


@PICKS
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_token_losses_match_numpy(smoothing, pick):
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((3, 5, 11)) * 4).astype(np.float32)
    targets = rng.integers(0, 11, (3, 5))
    weights = (rng.random((3, 5)) > 0.3).astype(np.float32)
    got = step_lib.token_losses(logits, targets, weights, smoothing, pick)
    np.testing.assert_allclose(got, numpy_losses(logits, targets, weights, smoothing), rtol=1e-5)


@PICKS
def test_token_loss_gradient_is_softmax_minus_smoothed_labels(pick):
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((2, 3, 7)).astype(np.float32)
    targets = rng.integers(0, 7, (2, 3))
    weights = np.ones((2, 3), np.float32)
    grad = jax.grad(lambda z: step_lib.token_losses(z, targets, weights, 0.1, pick)[0])(logits)
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    labels = np.full(logits.shape, 0.1 / 7)
    np.put_along_axis(labels, targets[..., None], 0.9 + 0.1 / 7, axis=-1)
    np.testing.assert_allclose(grad, probs - labels, atol=1e-6)


def _optimizer_config(schedule):
    import ml_collections

    return ml_collections.ConfigDict(dict(schedule=schedule, learning_rate=2e-3, warmup_steps=100))


def test_rsqrt_schedule_is_vaswanis_formula():
    schedule = step_lib.learning_rate_schedule(_optimizer_config("rsqrt"), 1000)
    # peak * min(step / warmup, sqrt(warmup / step)) at step = count + 1
    for count, expected in ((0, 2e-3 / 100), (99, 2e-3), (399, 2e-3 * 0.5)):
        assert float(schedule(count)) == pytest.approx(expected, rel=1e-6)


def test_cosine_schedule_warms_up_then_reaches_zero_at_the_last_step():
    schedule = step_lib.learning_rate_schedule(_optimizer_config("cosine"), 1100)
    assert float(schedule(0)) == 0.0
    assert float(schedule(50)) == pytest.approx(1e-3)  # linear warm-up
    assert float(schedule(100)) == pytest.approx(2e-3)
    assert float(schedule(600)) == pytest.approx(1e-3, rel=1e-5)  # half way down: peak (1 + cos(pi / 2)) / 2
    assert float(schedule(1100)) == pytest.approx(0.0, abs=1e-12)


def test_an_unknown_schedule_is_refused_by_name():
    with pytest.raises(ValueError, match=r"config.optimizer.schedule = 'linear'.*rsqrt"):
        step_lib.learning_rate_schedule(_optimizer_config("linear"), 1000)


def test_a_packed_batch_steps_as_the_same_pairs_padded_one_a_row():
    """The reference is the unpacked batch: one pair a row, padded; its loss and update must not change when packed."""
    pairs = [([5, 6, 7], [8, 9]), ([10, 11], [12, 13, 14]), ([15], [16])]
    padded = as_arrays(BatchSchedule.assemble([s for s, _ in pairs], [t for _, t in pairs], rows=3, length=4))
    packed = as_arrays(BatchSchedule.assemble_packed([pairs[:2], pairs[2:]], rows=2, length=8))
    model = Transformer(model_config(d_model=16, num_heads=2, num_layers=1, mlp_dim=24, max_len=8))
    params = model.init(jax.random.key(0), padded["src"], padded["tgt_in"])["params"]
    state = step_lib.train_state.TrainState.create(
        apply_fn=model.apply, params=params, tx=optax.sgd(1.0)
    )  # update = -gradient
    step = jax.jit(lambda s, b: step_lib.train_step(s, b, jax.random.key(1), label_smoothing=0.1))
    (state_padded, m_padded), (state_packed, m_packed) = step(state, padded), step(state, packed)
    assert float(m_packed["tokens"]) == float(m_padded["tokens"]) == 9  # 2 + 3 + 1 target tokens, each + EOS
    for name in ("loss", "nll", "grad_norm"):
        np.testing.assert_allclose(m_packed[name], m_padded[name], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(state_packed.params), jax.tree.leaves(state_padded.params)):
        np.testing.assert_allclose(a, b, atol=1e-6)  # the same gradient


@pytest.mark.slow  # trains adaptive spans for many steps (~10 s): kept out of the default suite's time budget
def test_the_adaptive_span_l1_penalty_joins_the_loss_and_pulls_the_spans_in():
    """Loss with λ > 0 = loss without + λ Σ_layers mean_h(S clip(span_h, 0, 1)) (Sukhbaatar et al.'s L1), by hand."""
    batch = as_arrays(BatchSchedule.assemble([[5, 6, 7], [10, 11]], [[8, 9], [12, 13, 14]], rows=2, length=4))
    config = dict(d_model=16, num_heads=2, num_layers=1, mlp_dim=24, max_len=8, attention_type="span")
    penalised, plain = (
        Transformer(model_config(**config, attention_options=dict(max_span=6, l1_penalty=lam))) for lam in (0.01, 0.0)
    )
    params = plain.init(jax.random.key(0), batch["src"], batch["tgt_in"])["params"]
    fractions = {
        "/".join(str(k.key) for k in path): np.asarray(leaf)  # every span sublayer's [H] parameter
        for path, leaf in jax.tree_util.tree_leaves_with_path(params)
        if path[-1].key == "span"
    }
    fractions["encoder/layer_0/self_attention/span/span"] = np.array([0.5, 1.7])  # clipped to 1: 6 positions
    fractions["decoder/layer_0/self_attention/span/span"] = np.array([0.25, 0.8])  # inside (0, 1): a gradient
    params = jax.tree_util.tree_map_with_path(
        lambda path, leaf: fractions.get("/".join(str(k.key) for k in path), leaf), params
    )
    assert len(fractions) == 2  # the encoder's and the decoder's self-attention (span is self-attention only)
    penalty = 0.01 * sum(np.mean(6 * np.clip(f, 0, 1)) for f in fractions.values())
    losses, updated = {}, {}
    for name, model in (("penalised", penalised), ("plain", plain)):
        state = step_lib.train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.sgd(1.0))
        updated[name], metrics = step_lib.train_step(state, batch, jax.random.key(1), label_smoothing=0.1)
        losses[name] = float(metrics["loss"])
    np.testing.assert_allclose(losses["penalised"] - losses["plain"], penalty, rtol=1e-4)
    span = lambda s: np.asarray(s.params["decoder"]["layer_0"]["self_attention"]["span"]["span"])
    # the penalty's gradient, λ S / H per unclipped head, is added to the update: spans shrink by it
    np.testing.assert_allclose(span(updated["plain"]) - span(updated["penalised"]), 0.01 * 6 / 2, rtol=1e-4)
