"""XLA:CPU's dropout draw (`backends.xla_cpu.dropout_keep` in `models.dropout.Dropout`) against NumPy: the mask is the
words' 16-bit halves below the threshold, survivors scaled exactly; and the plain draw is Flax's."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from backends import xla_cpu
from models import dropout


def _bits_dropout(rate, **kwargs):
    return dropout.Dropout(rate, keep=xla_cpu.dropout_keep, **kwargs)


def test_keep_threshold_hand_worked():
    # rate 0.1: 0.9 * 65536 = 58982.4 -> 58982; rate 0.5 -> 32768; rate 0 -> every half kept.
    assert xla_cpu.keep_threshold(0.1) == 58982
    assert xla_cpu.keep_threshold(0.5) == 32768
    assert xla_cpu.keep_threshold(0.0) == 65536


@pytest.mark.parametrize("rate", [-0.1, 1.0, 1.5])
def test_bad_rate_names_it(rate):
    layer = _bits_dropout(rate, deterministic=False)
    with pytest.raises(ValueError, match=r"dropout rate must be in \[0, 1\), got"):
        layer.apply({}, jnp.ones((3, 5)), rngs={"dropout": jax.random.key(0)})


@pytest.mark.parametrize("shape", [(4, 6, 8), (3, 5, 7)])  # even and odd element counts
def test_layer_equals_numpy_from_the_words(shape):
    rate, key = 0.3, jax.random.key(7)
    x = jax.random.normal(jax.random.key(1), shape)
    layer = _bits_dropout(rate, deterministic=False)
    out = np.asarray(layer.apply({}, x, rngs={"dropout": key}))
    # The reference: the words of the layer's rng, split in NumPy (low half first, then high).
    size = int(np.prod(shape))
    words = np.asarray(jax.random.bits(_top_level_rng(key), ((size + 1) // 2,), jnp.uint32))
    halves = np.stack([words & 0xFFFF, words >> 16], axis=-1).reshape(-1)[:size].reshape(shape)
    threshold = round((1 - rate) * 65536)
    expected = np.where(halves < threshold, np.asarray(x) / (threshold / 65536), 0.0)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=0)


def _top_level_rng(key):
    """The rng a top-level module's first `make_rng('dropout')` returns, read back from Flax."""

    class Probe(nn.Module):
        @nn.compact
        def __call__(self):
            return jax.random.key_data(self.make_rng("dropout"))

    return jax.random.wrap_key_data(Probe().apply({}, rngs={"dropout": key}))


def test_deterministic_and_rate_zero_return_the_input():
    x = jnp.arange(12.0).reshape(3, 4)
    assert _bits_dropout(0.1, deterministic=True).apply({}, x) is x
    assert _bits_dropout(0.0, deterministic=False).apply({}, x, rngs={"dropout": jax.random.key(0)}) is x


def test_kept_fraction_and_mean_match_the_rate():
    # 2**20 elements: the kept fraction's standard deviation is sqrt(0.9 * 0.1 / 2**20) = 2.9e-4.
    x = jnp.ones((1024, 1024))
    out = np.asarray(_bits_dropout(0.1, deterministic=False).apply({}, x, rngs={"dropout": jax.random.key(3)}))
    kept = out != 0
    assert abs(kept.mean() - 0.9) < 4 * 2.9e-4
    np.testing.assert_allclose(out[kept], 65536 / 58982, rtol=1e-7)
    assert abs(out.mean() - 1.0) < 4 * 2.9e-4 / 0.9


def test_bfloat16_keeps_dtype_and_gradient_is_the_mask():
    x = jnp.ones((64, 32), jnp.bfloat16)
    layer = _bits_dropout(0.25, deterministic=False)
    rngs = {"dropout": jax.random.key(5)}
    out = layer.apply({}, x, rngs=rngs)
    assert out.dtype == jnp.bfloat16
    grad = jax.grad(lambda x: layer.apply({}, x, rngs=rngs).astype(jnp.float32).sum())(x)
    np.testing.assert_array_equal(np.asarray(grad != 0), np.asarray(out != 0))


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_plain_draw_is_flaxs(rate):
    """Without a `keep` hook the layer is `flax.linen.Dropout`: the same key gives the same output."""
    x = jax.random.normal(jax.random.key(2), (4, 6, 8))
    rngs = {"dropout": jax.random.key(9)}
    ours = dropout.Dropout(rate, deterministic=False).apply({}, x, rngs=rngs)
    theirs = nn.Dropout(rate, deterministic=False).apply({}, x, rngs=rngs)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
