"""Test-wide JAX settings: fail on implicit rank promotion, as nanodo does."""

import jax

jax.config.update("jax_numpy_rank_promotion", "raise")
