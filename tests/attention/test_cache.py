"""The decode-cache write against a NumPy loop: one position for the batch and one per sequence, alike."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention import cache

B, G, L, D = 3, 2, 8, 4


def reference_write(cache_, new, index):
    """cache `[B, G, L, D]`, new `[B, L_new, G, D]`, index `[]` or `[B]`: position p of row b set if 0 <= p < L."""
    out = np.array(cache_)
    index = np.broadcast_to(index, (cache_.shape[0],))
    for b in range(cache_.shape[0]):
        for i in range(new.shape[1]):
            if 0 <= index[b] + i < cache_.shape[2]:
                out[b, :, index[b] + i, :] = new[b, i]
    return out


@pytest.mark.parametrize("new_length", [1, 3])
@pytest.mark.parametrize("index", [0, 2, L - 3, L - 2, L - 1, L, L + 5, -1, -2, -4], ids=lambda i: f"index{i}")
@pytest.mark.parametrize("per_sequence", [False, True], ids=["shared", "per_sequence"])
def test_write_sets_the_positions_inside_the_cache_and_drops_the_others(new_length, index, per_sequence):
    rng = np.random.default_rng(0)
    old = rng.normal(size=(B, G, L, D)).astype(np.float32)
    new = rng.normal(size=(B, new_length, G, D)).astype(np.float32)
    index = np.array([index, 0, L - 1] if per_sequence else index, np.int32)  # rows elsewhere too
    expected = reference_write(old, new, index)
    np.testing.assert_array_equal(cache.write(jnp.asarray(old), jnp.asarray(new), jnp.asarray(index)), expected)
    np.testing.assert_array_equal(jax.jit(cache.write)(old, new, index), expected)  # traced index


def test_write_with_extra_batch_axes_and_a_narrower_cache_dtype():
    rng = np.random.default_rng(1)
    old = rng.normal(size=(2, B, G, L, D)).astype(np.float32)
    new = rng.normal(size=(2, B, 2, G, D)).astype(np.float32)
    got = cache.write(jnp.asarray(old, jnp.bfloat16), jnp.asarray(new), jnp.asarray(L - 1, jnp.int32))
    assert got.dtype == jnp.bfloat16
    expected = np.stack(
        [reference_write(o, n, L - 1) for o, n in zip(old, new.astype(jnp.bfloat16).astype(np.float32))]
    )
    np.testing.assert_array_equal(
        np.asarray(got, np.float32), np.asarray(jnp.asarray(expected, jnp.bfloat16), np.float32)
    )
