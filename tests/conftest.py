"""Test-wide JAX settings: fail on implicit rank promotion, as nanodo does."""

import jax

jax.config.update("jax_numpy_rank_promotion", "raise")

# Many tests compile the same step functions; a session-wide persistent cache compiles each once.
import tempfile

jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp(prefix="headcount-jax-cache-"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
