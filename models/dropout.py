"""Dropout for the model's activations, with the keep-mask draw chosen by backend.

By default the keep-mask is Flax's (`jax.random.bernoulli`, as `flax.linen.Dropout` draws it).
`keep` replaces that draw, e.g. with `backends.xla_cpu.dropout_keep`, which draws two decisions
from each 32-bit random word where hashing is most of dropout's cost (XLA:CPU); the training
config passes it in through `TransformerConfig.dropout_keep`.
"""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax


def bernoulli_keep(rng: jax.Array, rate: float, shape: tuple[int, ...]) -> tuple[jax.Array, float]:
    """Flax's draw: (bool keep-mask of `shape`, keep probability 1 - rate)."""
    return jax.random.bernoulli(rng, 1.0 - rate, shape), 1.0 - rate


class Dropout(nn.Module):
    """`nn.Dropout(rate, deterministic)` for the model's activations: [...] -> [...], same dtype.

    `keep(rng, rate, shape) -> (bool mask, keep probability)` draws the mask (default:
    `bernoulli_keep`); survivors are divided by the keep probability it returns.
    """

    rate: float
    deterministic: bool | None = None
    rng_collection: str = "dropout"
    keep: Callable | None = None

    @nn.compact
    def __call__(self, inputs: jax.Array, deterministic: bool | None = None) -> jax.Array:
        deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
        if not 0.0 <= self.rate < 1.0:
            raise ValueError(f"dropout rate must be in [0, 1), got {self.rate}")
        if self.rate == 0.0 or deterministic:
            return inputs
        keep, keep_prob = (self.keep or bernoulli_keep)(self.make_rng(self.rng_collection), self.rate, inputs.shape)
        return lax.select(keep, inputs / keep_prob, jnp.zeros_like(inputs))
