"""Backend-specific workarounds, kept out of the model; the training config chooses one and passes it in.

`dense_dot_general(matmul, dtype)` is that choice for the dense layers and the logits:
  "xla"       -- None: Flax's default `lax.dot_general`;
  "row_major" -- `xla_cpu_bf16.row_major_dot_general`, whatever the backend;
  "auto"      -- row_major only where it pays: JAX on the CPU, a 16-bit compute dtype, and a
                 CPU with native bfloat16 (AVX512-BF16 / AMX-BF16); "xla" everywhere else.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import jax
import jax.numpy as jnp

from backends import xla_cpu_bf16

MATMULS = ("auto", "xla", "row_major")


@functools.lru_cache(maxsize=None)  # one decision (and one log line) per setting
def dense_dot_general(matmul: str, dtype) -> Callable | None:
    """The `dot_general` for `TransformerConfig.dot_general` (None: `lax.dot_general`)."""
    if matmul not in MATMULS:
        raise ValueError(f"matmul = {matmul!r}; expected one of {MATMULS}")
    if matmul == "auto":
        backend, bits = jax.default_backend(), 8 * jnp.dtype(dtype).itemsize
        native = backend == "cpu" and xla_cpu_bf16.cpu_has_native_bf16()
        matmul = "row_major" if native and bits == 16 else "xla"
        logging.info("matmul 'auto' -> %r (backend %s, %d-bit compute, native CPU bfloat16: %s)",
                     matmul, backend, bits, native)
    return xla_cpu_bf16.row_major_dot_general if matmul == "row_major" else None
