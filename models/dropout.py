"""Dropout that draws two keep-decisions from each 32-bit random word.

`flax.linen.Dropout` draws one threefry word per element (`jax.random.bernoulli`); on CPU that
hash is most of what dropout costs. Here each word's two 16-bit halves decide two elements, so
half as many words are hashed. The keep probability becomes `round((1 - rate) * 2**16) / 2**16`
(0.8999939 for rate 0.1: within 2**-17 of the asked rate) and survivors are divided by that same
number, so the layer's expectation is its input exactly, as Flax's is. Masks differ from Flax's
for the same key (another draw of the same distribution).

Measured (`bench/dropout.py`, results/peer.md section 7): forward + backward at the default
config's activations in 0.49-0.50x Flax's time in float32 (0.39-0.67x in bfloat16) on one core of
an AMD EPYC Zen 4; dropout being a few percent of a training step, the step gains ~1-3 %.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

BITS = 16  # per decision; 32 // BITS decisions per random word


def keep_threshold(rate: float) -> int:
    """Halves `h` (uniform on [0, 2**16)) with `h < keep_threshold(rate)` are kept."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"dropout rate must be in [0, 1), got {rate}")
    return round((1.0 - rate) * 2**BITS)


def keep_mask(rng: jax.Array, threshold: int, shape: tuple[int, ...]) -> jax.Array:
    """Boolean keep-mask of `shape`: element i is kept if half i % 2 (little-endian) of word i // 2 is below `threshold`."""
    size = math.prod(shape)
    per_word = 32 // BITS
    words = jax.random.bits(rng, (-(-size // per_word),), jnp.uint32)
    halves = lax.bitcast_convert_type(words, jnp.uint16).reshape(-1)[:size].reshape(shape)
    return halves.astype(jnp.int32) < threshold


class Dropout(nn.Module):
    """`nn.Dropout(rate, deterministic)` for the model's activations: [...] -> [...], same dtype."""

    rate: float
    deterministic: bool | None = None
    rng_collection: str = "dropout"

    @nn.compact
    def __call__(self, inputs: jax.Array, deterministic: bool | None = None) -> jax.Array:
        deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
        threshold = keep_threshold(self.rate)
        if self.rate == 0.0 or deterministic:
            return inputs
        keep = keep_mask(self.make_rng(self.rng_collection), threshold, inputs.shape)
        return lax.select(keep, inputs / (threshold / 2**BITS), jnp.zeros_like(inputs))
