"""Backend-specific workarounds, kept out of the model; the training config chooses one and passes it in.

`dense_dot_general(matmul, dtype)` is that choice for the dense layers and the logits:
  "xla"       -- None: Flax's default `lax.dot_general`;
  "row_major" -- `xla_cpu_bf16.row_major_dot_general`, whatever the backend;
  "auto"      -- row_major where it pays: a 16-bit compute dtype on JAX's CPU backend, whether
                 or not the CPU has native bfloat16 (without it, row_major's float32 products and
                 elementwise work still ran a bf16 step 1.56x faster than xla's on a Zen 3:
                 results/code_choices.md); "xla" everywhere else.
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
    if matmul == "auto":  # the cheap checks first: a 32-bit model never asks JAX for its backend
        pays = jnp.dtype(dtype).itemsize == 2 and jax.default_backend() == "cpu"
        matmul = "row_major" if pays else "xla"
        logging.info("matmul 'auto' -> %r (16-bit compute on XLA:CPU: %s)", matmul, pays)
    return xla_cpu_bf16.row_major_dot_general if matmul == "row_major" else None
