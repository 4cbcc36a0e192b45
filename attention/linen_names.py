"""Flax Linen's class names for the Linen layer, so that a model swapping its import keeps Flax's parameter paths.

An unnamed `MultiHeadDotProductAttention` submodule gets Flax's automatic path
(`MultiHeadDotProductAttention_0`); `SelfAttention` is Flax's deprecated self-attention call.
"""

from __future__ import annotations

import warnings

import flax.linen as nn
import jax

from attention.layer import MultiHeadAttention


class MultiHeadDotProductAttention(MultiHeadAttention):
    """`MultiHeadAttention` under Flax's class name: unnamed instances get Flax's parameter paths."""


class SelfAttention(MultiHeadDotProductAttention):
    """Flax's `nn.SelfAttention`: self-attention with `mask` as the second positional argument.

    Deprecated in Flax, and it warns as Flax's does; use `MultiHeadDotProductAttention(x)`.
    """

    @nn.compact
    def __call__(  # type: ignore[override]
        self,
        inputs_q: jax.Array,
        mask: jax.Array | None = None,
        deterministic: bool | None = None,
        dropout_rng: jax.Array | None = None,
        sow_weights: bool = False,
        **kwargs,
    ) -> jax.Array:
        """`inputs_q [batch..., L, D]` -> `[batch..., L, out_features or D]`; kwargs: head_mask, is_causal."""
        warnings.warn(
            "SelfAttention will be deprecated soon. Use `MultiHeadDotProductAttention.__call__(inputs_q)` instead. "
            "See https://github.com/google/flax/discussions/3389 for more information.",
            DeprecationWarning,
            stacklevel=2,
        )
        return super().__call__(
            inputs_q, mask=mask, deterministic=deterministic, dropout_rng=dropout_rng, sow_weights=sow_weights, **kwargs
        )
