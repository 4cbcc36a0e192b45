"""Greedy and beam search against naive uncached loops, full-pass rescoring and a hand-built model."""

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import models
from attention.head import Formulation
from backends import xla_cpu
from models import decoding
from tiny import model_config

KEY = jax.random.key(0)
PAD, EOS, BOS = 0, 1, 2
SRC = jnp.array([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14], [15, 3, 0, 0, 0, 0]], jnp.int32)
MAX_LEN = 8

greedy = jax.jit(models.greedy_decode, static_argnums=(0, 3), static_argnames=("first_cache_length", "return_steps"))
beam = jax.jit(
    models.beam_search,
    static_argnums=(0,),
    static_argnames=("beam_size", "alpha", "max_len", "return_all_beams", "first_cache_length", "return_steps"),
)
# first_cache_length=3 grows the cache through 3, 6, 8 positions within MAX_LEN's 8 steps
GROWN = [None, 3]


def tiny(**overrides):
    return model_config(**{"num_kv_heads": 2, "tie_embeddings": False, **overrides})


@functools.cache
def random_model(eos_bias=0.0):
    """A random untied model (tied random models mostly echo their input token); `eos_bias` makes EOS likelier."""
    model = models.Transformer(tiny())
    params = model.init(KEY, SRC, SRC)["params"]
    bias = params["decoder"]["logits"]["bias"]
    params["decoder"]["logits"]["bias"] = bias.at[EOS].add(eos_bias)
    return model, params


def naive_greedy(model, params, src, max_len):
    """Greedy without the cache: the full decoder re-run on [BOS] + prefix at every step.

    The prefix sits in a fixed [B, max_len] buffer (one shape, one compilation); the pad
    after it cannot matter, as the causality test in test_transformer.py checks.
    """
    buffer = np.full((src.shape[0], max_len), PAD, np.int32)
    buffer[:, 0] = BOS
    out = np.full((src.shape[0], max_len), PAD, np.int32)
    done = np.zeros(src.shape[0], bool)
    for t in range(max_len):
        logits = model.apply({"params": params}, src, jnp.asarray(buffer))
        out[:, t] = np.where(done, PAD, np.argmax(logits[:, t], axis=-1))
        done |= out[:, t] == EOS
        if t + 1 < max_len:
            buffer[:, t + 1] = out[:, t]
    return out


def rescore(model, params, src, seq, alpha):
    """log P(seq up to and including its first EOS) / lp(length), from one uncached forward pass (float64)."""
    seq = np.asarray(seq)
    length = int(np.argmax(seq == EOS)) + 1 if (seq == EOS).any() else len(seq)
    assert (seq[length:] == PAD).all()  # padded after EOS
    tgt_in = jnp.array([[BOS, *seq[:-1]]], jnp.int32)  # full length: one shape for every call
    logits = np.asarray(model.apply({"params": params}, src[None], tgt_in)[0], np.float64)
    log_probs = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    return sum(log_probs[t, seq[t]] for t in range(length)) / ((5 + length) / 6) ** alpha


@pytest.mark.parametrize("first_cache_length", GROWN)
def test_greedy_on_the_cache_equals_a_naive_uncached_loop(first_cache_length):
    model, params = random_model(eos_bias=2.0)
    tokens = np.asarray(greedy(model, params, SRC, MAX_LEN, first_cache_length=first_cache_length))
    np.testing.assert_array_equal(tokens, naive_greedy(model, params, SRC, MAX_LEN))
    assert (tokens == EOS).any(axis=1).any() and not (tokens == EOS).any(axis=1).all()  # both kinds of row


def test_beam_of_one_is_greedy():
    """alpha = 0: a length penalty could let a longer beam-1 hypothesis beat greedy's early EOS."""
    model, params = random_model(eos_bias=2.0)
    tokens, scores = beam(model, params, SRC, beam_size=1, alpha=0.0, max_len=MAX_LEN)
    np.testing.assert_array_equal(tokens, greedy(model, params, SRC, MAX_LEN))
    for b in range(SRC.shape[0]):
        assert scores[b] == pytest.approx(rescore(model, params, SRC[b], tokens[b], 0.0), abs=1e-4)


@pytest.mark.parametrize("first_cache_length", GROWN)
@pytest.mark.parametrize("eos_bias", [0.0, 3.0])
def test_beam_scores_are_sorted_and_equal_full_pass_rescoring(eos_bias, first_cache_length):
    model, params = random_model(eos_bias=eos_bias)
    seqs, scores = beam(
        model,
        params,
        SRC,
        beam_size=4,
        alpha=0.6,
        max_len=MAX_LEN,
        return_all_beams=True,
        first_cache_length=first_cache_length,
    )
    assert seqs.shape == (3, 4, MAX_LEN) and scores.shape == (3, 4)
    assert (np.diff(np.asarray(scores), axis=1) <= 0).all()
    for b in range(SRC.shape[0]):
        for k in range(4):
            assert scores[b, k] == pytest.approx(rescore(model, params, SRC[b], seqs[b, k], 0.6), abs=1e-4)
        assert len({tuple(s) for s in np.asarray(seqs[b])}) == 4  # distinct hypotheses
    best, best_scores = beam(
        model, params, SRC, beam_size=4, alpha=0.6, max_len=MAX_LEN, first_cache_length=first_cache_length
    )
    np.testing.assert_array_equal(best, seqs[:, 0])
    np.testing.assert_array_equal(best_scores, scores[:, 0])


# A hand-built decoder over tokens pad, EOS, BOS, A, B, C. The next-token distribution depends
# on the fed token and on the one before it, which lives in the cache, so beams must carry
# their own cache. From BOS: A .55, B .45. Greedy takes A, then C (.5), then EOS (.4): .11.
# Beam search keeps B, whose C (.9) is followed by EOS (.9): .3645.
A, B, C = 3, 4, 5
PROBS = np.zeros((6, 6, 6))  # [token before, fed token, next token]
PROBS[:, :, EOS] = 1.0  # any other context ends the sentence
PROBS[PAD, BOS] = [0, 0, 0, 0.55, 0.45, 0]
PROBS[BOS, A] = [0, 0.1, 0, 0.2, 0.2, 0.5]
PROBS[BOS, B] = [0, 0.1, 0, 0, 0, 0.9]
PROBS[A, C] = [0, 0.4, 0, 0.2, 0.2, 0.2]
PROBS[B, C] = [0, 0.9, 0, 0.1, 0, 0]


class HandBuiltDecoder(nn.Module):
    """The `Transformer` decoding interface (`config`, `encode`, `decode`) over the table PROBS."""

    config: models.TransformerConfig

    def encode(self, src_tokens):
        return jnp.zeros((*src_tokens.shape, 1))

    @nn.compact
    def decode(self, encoded, src_tokens, tgt_in_tokens, decode=False):
        """Next-token logits [B, 1, 6] for the last fed token; the cache keeps the one before."""
        sizing = not self.has_variable("cache", "before")
        before = self.variable("cache", "before", lambda: jnp.full(tgt_in_tokens.shape[:1], PAD, jnp.int32))
        if sizing:
            return jnp.zeros((*tgt_in_tokens.shape, 6))
        fed = tgt_in_tokens[:, -1]
        logits = jnp.log(jnp.asarray(PROBS, jnp.float32) + 1e-12)[before.value, fed]
        before.value = fed
        return logits[:, None]


def test_beam_search_beats_myopic_greedy_on_a_hand_built_model():
    model = HandBuiltDecoder(models.TransformerConfig(vocab_size=6, max_len=8))
    src = jnp.ones((2, 3), jnp.int32)
    np.testing.assert_array_equal(greedy(model, {}, src, 5), [[A, C, EOS, PAD, PAD]] * 2)
    tokens, scores = beam(model, {}, src, beam_size=2, alpha=0.6, max_len=5)
    np.testing.assert_array_equal(tokens, [[B, C, EOS, PAD, PAD]] * 2)
    np.testing.assert_allclose(scores, [math.log(0.45 * 0.9 * 0.9) / (8 / 6) ** 0.6] * 2, rtol=1e-5)


def test_step_counts_by_hand_on_the_hand_built_model():
    """Greedy stops on its EOS at step 3. Beam 2 after step 3 holds finished B C EOS, A C EOS (log .11 / lp(3) = -1.857)
    and alive A C A, A C B (log .055): at max_len 5 the bound log .055 / lp(5) = -2.134 is below the worst finished, so
    it stops there; at max_len 8 the bound is -1.823, so it runs a 4th step (both alive beams end: EOS at .055,
    -2.274)."""
    model = HandBuiltDecoder(models.TransformerConfig(vocab_size=6, max_len=8))
    src = jnp.ones((2, 3), jnp.int32)
    assert int(greedy(model, {}, src, 5, return_steps=True)[1]) == 3
    for max_len, steps in [(5, 3), (8, 4)]:
        tokens, _, loop_steps = beam(model, {}, src, beam_size=2, alpha=0.6, max_len=max_len, return_steps=True)
        np.testing.assert_array_equal(tokens[:, :3], [[B, C, EOS]] * 2)
        assert int(loop_steps) == steps


@pytest.mark.parametrize("eos_bias", [3.0, -1e9])
def test_greedy_runs_until_its_last_row_ends_and_an_endless_beam_to_max_len(eos_bias):
    model, params = random_model(eos_bias=eos_bias)
    tokens, steps = greedy(model, params, SRC, MAX_LEN, return_steps=True)
    ends = [int(np.argmax(row == EOS)) + 1 if (row == EOS).any() else MAX_LEN for row in np.asarray(tokens)]
    assert int(steps) == max(ends)
    if eos_bias < 0:
        assert int(beam(model, params, SRC, beam_size=3, alpha=0.6, max_len=MAX_LEN, return_steps=True)[2]) == MAX_LEN


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(beam_size=0), "beam_size must be a positive int"),
        (dict(alpha=-0.5), "alpha must be >= 0"),
        (dict(max_len=17), "max_len must be an int in \\[1, config.max_len=16\\]"),
    ],
)
def test_bad_beam_search_arguments_raise(kwargs, message):
    model, params = random_model()
    with pytest.raises(ValueError, match=message):
        models.beam_search(model, params, SRC, **{"max_len": MAX_LEN, **kwargs})


@pytest.mark.parametrize(
    "attention_type, options", [("mla", {}), ("performer", {}), ("span", {"max_span": 4, "ramp": 2})]
)
def test_members_caches_grow_to_the_naive_uncached_result(attention_type, options):
    """MLA's latent and span's K/V grow with the output; performer's fixed-size state is carried as it is."""
    model = models.Transformer(tiny(attention_type=attention_type, attention_options=options, num_kv_heads=None))
    params = model.init(KEY, SRC, SRC)["params"]
    tokens = np.asarray(greedy(model, params, SRC, MAX_LEN, first_cache_length=3))
    np.testing.assert_array_equal(tokens, naive_greedy(model, params, SRC, MAX_LEN))


@pytest.mark.parametrize("attention_type, options", [("span", {"max_span": 4, "ramp": 2}), ("mla", {})])
def test_members_beams_read_their_own_histories(attention_type, options):
    """span reads its K/V cache through the beam rows (gathered: `attention.beams.gather_history`); MLA's latent is
    reordered: either way every beam's score is its hypothesis's full-pass score."""
    model = models.Transformer(tiny(attention_type=attention_type, attention_options=options, num_kv_heads=None))
    params = model.init(KEY, SRC, SRC)["params"]
    seqs, scores = beam(
        model, params, SRC, beam_size=3, alpha=0.6, max_len=MAX_LEN, return_all_beams=True, first_cache_length=3
    )
    for b in range(SRC.shape[0]):
        for k in range(3):
            assert scores[b, k] == pytest.approx(rescore(model, params, SRC[b], seqs[b, k], 0.6), abs=1e-4)


class FlaxAttentionDecoder(nn.Module):
    """The decoding interface on Flax's own attention layer, whose `cached_key` ignores the beam rows."""

    config: models.TransformerConfig

    def __call__(self, src_tokens, tgt_in_tokens):
        return self.decode(self.encode(src_tokens), src_tokens, tgt_in_tokens)

    def encode(self, src_tokens):
        return jnp.zeros((*src_tokens.shape, 1))

    @nn.compact
    def decode(self, encoded, src_tokens, tgt_in_tokens, decode=False):
        x = nn.Embed(self.config.vocab_size, 16)(tgt_in_tokens)
        mask = None if decode else nn.make_causal_mask(tgt_in_tokens)
        x = x + nn.MultiHeadDotProductAttention(num_heads=2, decode=decode)(x, mask=mask)
        return nn.Dense(self.config.vocab_size)(x)


def test_a_foreign_layers_cache_is_still_reordered():
    """Flax's layer reads its cache row as the beam's own history, so beam search must move it there."""
    model = FlaxAttentionDecoder(models.TransformerConfig(vocab_size=20, max_len=16))
    params = model.init(KEY, SRC, SRC)["params"]
    seqs, scores = beam(model, params, SRC, beam_size=3, alpha=0.6, max_len=MAX_LEN, return_all_beams=True)
    for b in range(SRC.shape[0]):
        for k in range(3):
            assert scores[b, k] == pytest.approx(rescore(model, params, SRC[b], seqs[b, k], 0.6), abs=1e-4)


def test_cache_lengths_double_up_to_max_len():
    assert models.decoding.cache_lengths(90) == [16, 32, 64, 90]
    assert models.decoding.cache_lengths(64) == [16, 32, 64]
    assert models.decoding.cache_lengths(8) == [8]
    assert models.decoding.cache_lengths(90, None) == [90]
    with pytest.raises(ValueError, match="first_cache_length must be a positive int or None, got 0"):
        models.greedy_decode(*random_model(), SRC, MAX_LEN, first_cache_length=0)


def test_bad_source_raises():
    model, params = random_model()
    with pytest.raises(ValueError, match="src_tokens must be int tokens"):
        models.greedy_decode(model, params, SRC[0], MAX_LEN)


# Four toy "translations" (reverse the sentence, shift every token by 5) of different lengths.
PAIRS = [
    ([3, 4, 5, 6], [11, 10, 9, 8]),
    ([7, 3], [8, 12]),
    ([9, 10, 11], [16, 15, 14]),
    ([12, 4, 8, 6, 5], [10, 11, 13, 9, 17]),
]


def batch_pairs():
    """(src [4, 6], tgt_in [4, 6] = BOS + target, tgt_out [4, 6] = target + EOS), pad-filled."""
    src = np.full((4, 6), PAD, np.int32)
    tgt_in, tgt_out = src.copy(), src.copy()
    for i, (s, t) in enumerate(PAIRS):
        src[i, : len(s)] = s
        tgt_in[i, : len(t) + 1] = [BOS, *t]
        tgt_out[i, : len(t) + 1] = [*t, EOS]
    return jnp.asarray(src), jnp.asarray(tgt_in), jnp.asarray(tgt_out)


@pytest.mark.slow
def test_tiny_model_overfits_four_pairs_and_greedy_reproduces_them():
    model = models.Transformer(tiny(vocab_size=20, num_kv_heads=None, tie_embeddings=True))
    src, tgt_in, tgt_out = batch_pairs()
    params = model.init(KEY, src, tgt_in)["params"]
    optimizer = optax.adam(3e-3)

    def loss_fn(params):
        logits = model.apply({"params": params}, src, tgt_in)
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, tgt_out)
        weights = tgt_out != PAD
        return jnp.sum(losses * weights) / jnp.sum(weights)

    @jax.jit
    def train_step(params, opt_state):
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss

    opt_state = optimizer.init(params)
    for _ in range(300):
        params, opt_state, loss = train_step(params, opt_state)
    assert loss < 0.01
    expected = np.full((4, 8), PAD, np.int32)
    expected[:, :6] = tgt_out
    np.testing.assert_array_equal(greedy(model, params, src, 8), expected)
    tokens, _ = beam(model, params, src, beam_size=4, alpha=0.6, max_len=8)
    np.testing.assert_array_equal(tokens, expected)


def searcher(model, search=None, **switches):
    """All three beams of each source, jitted: by `search`, or (None) by the private entry point with its
    timing switch (`reorder_cache`) as given."""
    search = search or functools.partial(decoding._beam_search, **switches)
    return jax.jit(lambda p: search(model, p, SRC, beam_size=3, alpha=0.6, max_len=MAX_LEN, return_all_beams=True))


def search_with(model, params, **switches):
    return searcher(model, **switches)(params)


def test_beam_search_is_its_entry_point_with_the_reorder_on():
    model, params = random_model()
    public, private = searcher(model, models.beam_search), searcher(model)
    assert public.lower(params).as_text() == private.lower(params).as_text()


def test_without_the_reorder_a_foreign_layers_beams_go_wrong_and_ours_stay_right():
    # Flax's layer keeps its keys/values in its cache row, so only the reorder puts a beam's own history there
    foreign = FlaxAttentionDecoder(models.TransformerConfig(vocab_size=20, max_len=16))
    params = foreign.init(KEY, SRC, SRC)["params"]
    seqs, scores = search_with(foreign, params, reorder_cache=False)
    off = [
        abs(float(scores[b, k]) - rescore(foreign, params, SRC[b], seqs[b, k], 0.6))
        for b in range(SRC.shape[0])
        for k in range(3)
    ]
    assert max(off) > 1e-2  # some beam scored on another beam's history
    # our layers read their histories through the beam rows: the same search either way
    model, params = random_model()
    with_reorder, without = search_with(model, params), search_with(model, params, reorder_cache=False)
    np.testing.assert_array_equal(with_reorder[0], without[0])
    np.testing.assert_allclose(with_reorder[1], without[1], rtol=0, atol=1e-6)


class PlainLogProbs(xla_cpu.XlaCpuFormulation):
    """XLA:CPU's formulation but for the decode step's log-probabilities, spelled plainly."""

    def decode_log_probs(self, logits):
        return Formulation.decode_log_probs(self, logits)


def test_without_the_logits_barrier_the_program_loses_it_and_the_search_is_the_same():
    def barriers(formulation):
        model = models.Transformer(tiny(formulation=formulation))
        search = jax.jit(lambda p: models.beam_search(model, p, SRC, beam_size=3, max_len=MAX_LEN))
        return search.lower(random_model()[1]).as_text().count("optimization_barrier")

    assert barriers(PlainLogProbs()) < barriers(xla_cpu.FORMULATION)
    params = random_model()[1]
    kept = search_with(models.Transformer(tiny(formulation=xla_cpu.FORMULATION)), params)
    dropped = search_with(models.Transformer(tiny(formulation=PlainLogProbs())), params)
    np.testing.assert_array_equal(kept[0], dropped[0])
    np.testing.assert_allclose(kept[1], dropped[1], rtol=0, atol=1e-5)
