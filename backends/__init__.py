"""Backend-specific workarounds, kept out of the model; the training config chooses one and passes it in.

`dense_dot_general(matmul, dtype)` is that choice for the dense layers and the logits:
  "xla"       -- None: Flax's default `lax.dot_general`;
  "row_major" -- `xla_cpu_bf16.row_major_dot_general`, whatever the backend;
  "auto"      -- row_major where it pays: JAX's CPU backend, whatever the compute dtype. In
                 16 bits whether or not the CPU has native bfloat16 (without it, row_major's
                 float32 products and elementwise work still ran a bf16 step 1.56x faster than
                 xla's on a Zen 3); in float32 because XLA:CPU leaves a weight gradient (its left
                 operand contracting its first dimension) to a slower dot path than row-major
                 products (base train step 1.10x on a Zen 4; results/code_choices.md).
                 "xla" on every other backend.
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
        pays = jax.default_backend() == "cpu"
        matmul = "row_major" if pays else "xla"
        logging.info("matmul 'auto' -> %r (%s compute on XLA:CPU: %s)", matmul, jnp.dtype(dtype).name, pays)
    return xla_cpu_bf16.row_major_dot_general if matmul == "row_major" else None
