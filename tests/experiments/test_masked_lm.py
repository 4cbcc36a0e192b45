"""experiments.masked_lm's data (streams, rows, masks) and experiments.lib's scoring, against hand-worked values and
NumPy."""

import jax
import numpy as np
import pytest

from experiments.lib import Encoder, evaluate, fit
from experiments.masked_lm import eval_rows, mask_rows, token_stream, train_rows
from models.tokens import EOS_ID


class _Pieces:
    """A stand-in vocabulary: one id per word, 10 + its position in a fixed list."""

    words = ["a", "dog", "runs", "the", "cat"]

    def encode(self, sentences):
        return [[10 + self.words.index(w) for w in s.split()] for s in sentences]


def test_sentences_join_into_one_stream_each_closed_by_eos():
    stream = token_stream(_Pieces(), ["a dog runs", "the cat"])
    assert stream.tolist() == [10, 11, 12, EOS_ID, 13, 14, EOS_ID] and stream.dtype == np.int32


def test_each_row_masks_its_share_of_positions_and_keeps_the_originals_as_targets():
    rows = np.arange(40).reshape(2, 20) + 5
    tokens, targets, masked = mask_rows(np.random.default_rng(0), rows, rate=0.15, mask_id=99)
    assert masked.sum(axis=1).tolist() == [3, 3]  # round(0.15 * 20)
    assert (targets == rows).all()
    assert (tokens[masked] == 99).all() and (tokens[~masked] == rows[~masked]).all()


def test_training_rows_are_windows_of_the_stream_and_eval_rows_cut_it_in_order():
    stream = np.arange(50, dtype=np.int32)
    for row in train_rows(np.random.default_rng(1), stream, rows=5, length=7):
        assert row.tolist() == list(range(row[0], row[0] + 7))
    assert eval_rows(stream, 16).tolist() == [list(range(0, 16)), list(range(16, 32)), list(range(32, 48))]
    with pytest.raises(ValueError, match="length = 64 exceeds the evaluation stream"):
        eval_rows(stream, 64)
    with pytest.raises(ValueError, match="length = 64 exceeds the training stream"):
        train_rows(np.random.default_rng(1), stream, rows=1, length=64)


def test_evaluate_pools_accuracy_and_cross_entropy_over_the_scored_positions_of_all_batches():
    model = Encoder(vocab_size=11, length=6, attention_type="softmax")
    rng = np.random.default_rng(3)
    batches = [
        (
            rng.integers(0, 11, (b, 6)).astype(np.int32),
            rng.integers(0, 11, (b, 6)).astype(np.int32),
            rng.random((b, 6)) < 0.4,
        )
        for b in (2, 3)
    ]
    params = model.init(jax.random.key(0), batches[0][0])
    right = loss = count = 0.0
    for tokens, targets, scored in batches:
        logits = np.asarray(model.apply(params, tokens), np.float64)
        log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        picked = np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
        loss -= picked[scored].sum()
        right += (logits.argmax(-1) == targets)[scored].sum()
        count += scored.sum()
    scores = evaluate(model, params, batches)
    assert scores["scored"] == count
    assert scores["accuracy"] == pytest.approx(right / count)
    assert scores["loss"] == pytest.approx(loss / count, rel=1e-5)


def test_an_unknown_position_scheme_is_refused_by_name():
    with pytest.raises(ValueError, match="positions must be 'learned' or 'sinusoidal', got 'rotary'"):
        Encoder(vocab_size=5, length=4, attention_type="softmax", positions="rotary").init(
            jax.random.key(0), np.zeros((1, 4), np.int32)
        )


@pytest.mark.slow  # trains the encoder task (~11 s): kept out of the default suite's time budget
def test_lr_scales_freeze_or_slow_only_the_named_parameters():
    """Scale 0 leaves E and F as initialised; 0.5 moves them half as far as 1 (AdamW's update is linear in the rate:
    one update from the same gradients); every other parameter moves the same in all three runs."""
    model = Encoder(
        vocab_size=7, length=6, attention_type="linformer", attention_options={"max_length": 6, "projected_length": 3}
    )
    rng = np.random.default_rng(0)
    batch = (
        rng.integers(0, 7, (2, 6)).astype(np.int32),
        rng.integers(0, 7, (2, 6)).astype(np.int32),
        np.ones((2, 6), bool),
    )
    params = model.init(jax.random.key(0), batch[0])
    runs = {scale: fit(model, params, lambda: batch, 1, 1e-2, {"E": scale, "F": scale})[0] for scale in (0.0, 0.5, 1.0)}
    start = params["params"]["attention_0"]
    for name in ("E", "F"):
        moved = {
            scale: np.asarray(run["params"]["attention_0"]["linformer"][name] - start["linformer"][name])
            for scale, run in runs.items()
        }
        assert np.all(moved[0.0] == 0) and np.abs(moved[1.0]).max() > 1e-4
        np.testing.assert_allclose(moved[0.5], 0.5 * moved[1.0], rtol=1e-5, atol=1e-9)
    query = [np.asarray(run["params"]["attention_0"]["query"]["kernel"]) for run in runs.values()]
    assert np.abs(query[0] - np.asarray(start["query"]["kernel"])).max() > 1e-4
    np.testing.assert_array_equal(query[0], query[2])
