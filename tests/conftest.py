"""Test-wide JAX settings: fail on implicit rank promotion, as nanodo does; compile for speed of compiling."""

import os

from training.core import platforms

# The aot extra installs libtpu and the CUDA plugin, and JAX opens every platform it finds when it starts:
# on a machine with neither accelerator each try prints errors (the CUDA plugin a traceback). Where the
# machine shows no accelerator, the suite runs on the CPU it would fall back to anyway, as the CLIs do
# (training.core.platforms), and through the environment so that its plain `python -c` subprocesses do too;
# on a GPU or TPU machine JAX chooses as usual. tests/training/core/test_platforms.py starts train.py without it.
if chosen := platforms.platforms_for():
    os.environ["JAX_PLATFORMS"] = chosen

# The suite's programs are tiny, so its time is compiling them: LLVM's -O0 cuts the default suite's CPU
# time by about a quarter (660 s -> 476 s on one core). Set before JAX makes its CPU client; subprocesses
# (train.py, sweep.py, the sharding checks) inherit it, so both sides of a comparison compile alike.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()

# Float32 comparisons against NumPy are comparisons at full float32 precision. A GPU's default float32
# matmul is TF32 (10 mantissa bits: 1e-4 .. 1e-3 off a NumPy reference), the CPU's is full float32; the
# suite states the precision it tests here, once, so its tolerances hold on both. The environment
# variable (read when JAX starts) reaches the subprocesses (train.py, sweep.py) as well. A test about
# another precision scopes it itself (`jax.default_matmul_precision(...)` or a `precision=` argument).
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")

import jax

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_default_matmul_precision", os.environ["JAX_DEFAULT_MATMUL_PRECISION"])

# Many tests compile the same step functions; a session-wide persistent cache compiles each once.
import tempfile  # noqa: E402

SESSION_CACHE = tempfile.mkdtemp(prefix="headcount-jax-cache-")
jax.config.update("jax_compilation_cache_dir", SESSION_CACHE)
# The CLIs the tests start (train.py, eval.py, sweep.py: config 'auto') read JAX's cache from the environment:
# they share the session's too, and never fill or read the user's (~/.cache/headcount/jax, where real runs keep
# theirs). A test about the user's default unsets it for its subprocess.
os.environ["JAX_COMPILATION_CACHE_DIR"] = SESSION_CACHE
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
# Prepared training data (training.prepared) likewise goes to the session's own cache, never the user's.
os.environ["HEADCOUNT_PREPARED"] = tempfile.mkdtemp(prefix="headcount-prepared-")
