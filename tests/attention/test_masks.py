"""Mask constructors: Flax's semantics in bool, plus validation."""

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import pytest

import attention
from attention.masks import as_bool_mask, causal_from


def test_causal_mask_is_lower_triangular():
    mask = attention.make_causal_mask(jnp.zeros((2, 4)))
    assert mask.shape == (2, 1, 4, 4) and mask.dtype == jnp.bool_
    np.testing.assert_array_equal(mask[1, 0], np.tril(np.ones((4, 4), bool)))


def test_attention_mask_matches_flax():
    q_tokens = np.array([[3, 4, 0], [5, 0, 0]])
    k_tokens = np.array([[1, 2, 3, 0], [7, 8, 0, 0]])
    ours = attention.make_attention_mask(q_tokens > 0, k_tokens > 0, extra_batch_dims=1)
    flax_mask = nn.make_attention_mask(q_tokens > 0, k_tokens > 0, extra_batch_dims=1)
    assert ours.shape == flax_mask.shape == (1, 2, 1, 3, 4)
    np.testing.assert_array_equal(ours, flax_mask.astype(bool))
    assert ours[0, 0, 0, 0, 1] and not ours[0, 0, 0, 2, 0] and not ours[0, 1, 0, 0, 2]


def test_padding_mask_from_tokens_and_from_lengths_agree():
    tokens = np.array([[5, 6, 7, 0, 0], [8, 0, 0, 0, 0]])
    from_tokens = attention.make_padding_mask(tokens, pad_id=0)
    from_lengths = attention.make_padding_mask(lengths=np.array([3, 1]), max_length=5)
    expected = np.array([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], bool)[:, None, None, :]
    np.testing.assert_array_equal(from_tokens, expected)
    np.testing.assert_array_equal(from_lengths, expected)
    np.testing.assert_array_equal(attention.make_padding_mask(tokens + 1, pad_id=1), expected)


def test_combine_masks_is_logical_and():
    a = np.array([[[[True, True, False]]]])
    b = np.array([[[[True, False, False]]]])
    np.testing.assert_array_equal(attention.combine_masks(a, None, b), a & b)
    assert attention.combine_masks(None, None) is None


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: attention.make_padding_mask(), "exactly one of"),
        (lambda: attention.make_padding_mask(np.zeros(3), lengths=np.ones(1, int)), "exactly one of"),
        (lambda: attention.make_padding_mask(lengths=np.ones(2, int)), "max_length"),
        (lambda: attention.make_padding_mask(lengths=np.ones(2)), "integers"),
        (lambda: attention.make_padding_mask(np.zeros(()), pad_id=0), "length axis"),
        (lambda: attention.combine_masks(np.ones((1, 2), bool), np.ones((2,), bool)), "same rank"),
        (lambda: attention.combine_masks(np.ones((1, 2), bool), np.ones((1, 3), bool)), "do not broadcast"),
        (lambda: attention.make_attention_mask(np.ones((2, 3)), np.ones((3, 4))), "batch axes"),
        (lambda: attention.make_causal_mask(np.ones(())), "length axis"),
        (lambda: as_bool_mask("mask", np.ones((2, 3)), (2, 4)), r"mask has shape \(2, 3\)"),
    ],
)
def test_bad_mask_inputs_raise(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_numeric_masks_read_as_flaxs_jnp_where_reads_them():
    """Non-zero attends (so -inf in a *mask* attends: additive masks belong in `bias`)."""
    numeric = np.array([[0.0, 1.0, 0.5, -np.inf, np.nan, 3.0]], np.float32)
    for mask in (numeric, numeric.astype(jnp.bfloat16), np.array([[0, 1, 2, -1, 0, 7]], np.int8)):
        converted = as_bool_mask("mask", mask, (4, 1, 6))
        assert converted.dtype == jnp.bool_
        np.testing.assert_array_equal(converted, jnp.where(mask, True, False))
    assert as_bool_mask("mask", None, (1, 1)) is None


def test_helpers_with_dtype_float32_return_flaxs_masks():
    tokens = np.array([[3, 4, 0], [5, 0, 0]])
    np.testing.assert_array_equal(
        attention.make_attention_mask(tokens > 0, tokens > 0, dtype=jnp.float32),
        nn.make_attention_mask(tokens > 0, tokens > 0),
    )
    flax_causal = nn.make_causal_mask(tokens)
    ours_causal = attention.make_causal_mask(tokens, dtype=jnp.float32)
    assert ours_causal.dtype == flax_causal.dtype == jnp.float32
    np.testing.assert_array_equal(ours_causal, flax_causal)


def test_causal_from_is_the_decode_steps_causality_by_absolute_position():
    """Query i at position offset + i sees keys j <= offset + i; offset 0 is make_causal_mask's."""
    offsets = np.array([0, 3])
    got = np.asarray(causal_from(jnp.asarray(offsets), 2, 6))
    assert got.shape == (2, 2, 6) and got.dtype == bool
    for b, offset in enumerate(offsets):
        for i in range(2):
            np.testing.assert_array_equal(got[b, i], np.arange(6) <= offset + i)
    np.testing.assert_array_equal(causal_from(0, 4, 4), attention.make_causal_mask(jnp.ones(4))[0])
