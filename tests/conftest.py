"""Test-wide JAX settings: fail on implicit rank promotion, as nanodo does; compile for speed of compiling."""

import os

# The suite's programs are tiny, so its time is compiling them: LLVM's -O0 cuts the default suite's CPU
# time by about a quarter (660 s -> 476 s on one core). Set before JAX makes its CPU client; subprocesses
# (train.py, sweep.py, the sharding checks) inherit it, so both sides of a comparison compile alike.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")

# Many tests compile the same step functions; a session-wide persistent cache compiles each once.
import tempfile  # noqa: E402

jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp(prefix="headcount-jax-cache-"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
