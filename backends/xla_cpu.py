"""XLA:CPU's spellings of attention's cache writes and dropout draws: the same numbers, faster there.

Nothing in attention/ or models/ imports this module: `backends.model_hooks` picks these for the
CPU and the training config passes them to the model (`TransformerConfig.formulation`,
`TransformerConfig.dropout_keep`), as it passes `xla_cpu_bf16.row_major_dot_general`. On every
other backend the model runs the plain formulation (`attention.head.Formulation`,
Flax's `jax.random.bernoulli` dropout).

* Cache updates behind `lax.optimization_barrier` (`write_cache`): one materialised update per cache,
  read by the attention and returned; without it XLA:CPU may fuse the update into each consumer and
  copy the (donated) cache. The same barrier keeps beam search's small query block materialised
  (`broadcast_queries`, `attention.beams`), and a decode step's logits apart from its log_softmax
  (`decode_log_probs`).
* Attention's two products stay plain: the (K Qᵀ)ᵀ logits for few queries and a float32 sum for one
  16-bit query row no longer paid on jax 0.12.1 (results/code_choices.md) and were deleted.
* The loss reads the targets' logits with a gather (`target_logits`): on XLA:CPU its gradient's
  scatter costs less than the plain masked sum's select over the vocabulary (results/code_choices.md).
* Dropout keep-masks from each 32-bit random word's two 16-bit halves: the threefry hash is most
  of what dropout costs on CPU, and this hashes half as many words (results/peer.md section 7).
  The keep probability becomes `round((1 - rate) * 2**16) / 2**16` (0.8999939 for rate 0.1) and
  survivors are divided by that same number, so the expectation is the input exactly; masks
  differ from Flax's for the same key (another draw of the same distribution).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax import lax

from attention.head import Formulation

BITS = 16  # per dropout decision; 32 // BITS decisions per random word


class XlaCpuFormulation(Formulation):
    """`Formulation` with XLA:CPU's materialised cache updates and decode logits (platform "cpu")."""

    def __init__(self):
        super().__init__("cpu")

    def materialize(self, tree):
        return lax.optimization_barrier(tree)

    def decode_log_probs(self, logits):
        """log_softmax of the logits materialised apart: XLA:CPU fuses its max into the vocabulary matmul
        otherwise, and that ran slower (results/peer.md, section 5)."""
        return super().decode_log_probs(self.materialize(logits))

    def write_cache(self, cache, key, value):
        """The written keys and values behind one barrier: one update per cache, read by the attention and stored."""
        written = super().write_cache(cache, key, value)
        key, value = self.materialize((written.key, written.value))
        return dataclasses.replace(written, key=key, value=value)

    def broadcast_queries(self, queries, shape):
        """The broadcast query block materialised: else XLA drops the broadcast axis from the product's batch axes
        and then transposes the whole cache every step."""
        return self.materialize(super().broadcast_queries(queries, shape))


FORMULATION = XlaCpuFormulation()


def keep_threshold(rate: float) -> int:
    """Halves `h` (uniform on [0, 2**16)) with `h < keep_threshold(rate)` are kept."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"dropout rate must be in [0, 1), got {rate}")
    return round((1.0 - rate) * 2**BITS)


def keep_mask(rng: jax.Array, threshold: int, shape: tuple[int, ...]) -> jax.Array:
    """Boolean keep-mask of `shape`: element i is kept if half i % 2 (little-endian) of word i // 2 is below
    `threshold`."""
    size = math.prod(shape)
    per_word = 32 // BITS
    words = jax.random.bits(rng, (-(-size // per_word),), jnp.uint32)
    halves = lax.bitcast_convert_type(words, jnp.uint16).reshape(-1)[:size].reshape(shape)
    return halves.astype(jnp.int32) < threshold


def dropout_keep(rng: jax.Array, rate: float, shape: tuple[int, ...]) -> tuple[jax.Array, float]:
    """`models.dropout.Dropout`'s `keep` hook: (bool keep-mask of `shape`, the keep probability it draws with)."""
    threshold = keep_threshold(rate)
    return keep_mask(rng, threshold, shape), threshold / 2**BITS


def target_logits(logits, targets):
    """logits [B, L, V] at the targets [B, L] -> [B, L] by a gather (`training.core.step.target_logits`' numbers)."""
    return jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
