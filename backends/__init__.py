"""Backend-specific choices, kept out of the model: chosen here, by platform, once; the training config passes them in.

`model_hooks(matmul, dtype, platform)` is the one place that decides, returning the
`TransformerConfig` fields:
  dot_general  -- `dense_dot_general(matmul, dtype, platform)`, for the dense layers and the logits:
    "xla"       -- None: Flax's default `lax.dot_general`;
    "row_major" -- `xla_cpu_bf16.row_major_dot_general` on XLA:CPU; for any other platform the same as
                   "auto" there (XLA's dots). The row-major form is an XLA:CPU layout trick: on a GPU or
                   TPU the bf16 operands already multiply with float32 accumulation in the matrix units,
                   while the trick's copied transposes (held by optimisation barriers) and float32
                   results (pushing bias, activation, dropout and residual work into float32) only add
                   kernels and bytes. So a config that pins it (the Table 3 preset did, before it took
                   "auto") runs the accelerator's own dots on an accelerator, and CPU runs are unchanged;
    "auto"      -- row_major where it pays: XLA:CPU with 16-bit compute, whether or not the CPU has
                   native bfloat16 (its float32 products and elementwise work ran bf16 train steps and
                   decoding faster than xla's); "xla" for float32 compute, where XLA:CPU's own dots
                   are as fast since jax 0.12.1, and on every other backend (results/code_choices.md).
  formulation  -- attention's products and cache writes: `xla_cpu.FORMULATION` on the CPU, the plain
                  formulation (`attention.Formulation`) for `platform` elsewhere; either names its
                  platform, so what depends on it (`impl="auto"` taking cuDNN) is chosen for the
                  program's target, not for the backend that happens to trace it;
  dropout_keep -- the dropout keep-mask draw: `xla_cpu.dropout_keep` on the CPU, None (Flax's
                  `jax.random.bernoulli`) elsewhere.

`target_logits(platform)` is the training loss's one choice (`training.core.step.token_losses`' pick of
the targets' logits): `xla_cpu.target_logits`, a gather, on the CPU; None (the plain masked sum, whose
gradient XLA fuses into the softmax's) elsewhere. The trainers and the dev loss read the platform off the
model's formulation, so a program compiled for a GPU gets the GPU's choice.

`grad_norm_every_step(platform)`: whether the train step computes the logged gradient norm on every step
(XLA:CPU: one program; its reductions cost little there) or the trainers compile a second step with it for
the logged steps only (GPUs and TPUs: the norm is one small reduction kernel a parameter, 167 of the 1,560
kernels of the base model's compiled H100 step without clipping: results/peer_compiled.md).

`platform` is a JAX platform name ("cpu", "cuda", "rocm", "gpu", "tpu"); None means the default
backend of this process, read here, once. Lowering for another platform (`jax.export(..., platforms=("cuda",))`)
takes the hooks chosen for that platform: on a GPU or TPU nothing tuned for XLA:CPU runs.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from attention.head import Formulation
from backends import xla_cpu, xla_cpu_bf16

MATMULS = ("auto", "xla", "row_major")


def is_cpu(platform: str | None = None) -> bool:
    """Whether `platform` (default: this process's default backend) is XLA:CPU."""
    return (platform or jax.default_backend()).lower() == "cpu"


@functools.lru_cache(maxsize=None)  # one decision (and one log line) per setting
def dense_dot_general(matmul: str, dtype, platform: str | None = None) -> Callable | None:
    """The `dot_general` for `TransformerConfig.dot_general` (None: `lax.dot_general`)."""
    if matmul not in MATMULS:
        raise ValueError(f"matmul = {matmul!r}; expected one of {MATMULS}")
    if matmul == "row_major" and not is_cpu(platform):
        logging.info(
            "matmul 'row_major' -> 'xla' for platform %r (the row-major product is an XLA:CPU trick)",
            platform or jax.default_backend(),
        )
        return None
    if matmul == "auto":
        pays = is_cpu(platform) and jnp.dtype(dtype).itemsize == 2
        matmul = "row_major" if pays else "xla"
        logging.info("matmul 'auto' -> %r (%s compute on XLA:CPU: %s)", matmul, jnp.dtype(dtype).name, pays)
    return xla_cpu_bf16.row_major_dot_general if matmul == "row_major" else None


def model_hooks(matmul: str, dtype, platform: str | None = None) -> dict[str, Any]:
    """`TransformerConfig`'s backend fields (dot_general, formulation, dropout_keep) for `platform`."""
    platform = (platform or jax.default_backend()).lower()
    cpu = is_cpu(platform)
    return {
        "dot_general": dense_dot_general(matmul, dtype, platform),
        "formulation": xla_cpu.FORMULATION if cpu else Formulation(platform),
        "dropout_keep": xla_cpu.dropout_keep if cpu else None,
    }


def target_logits(platform: str | None = None) -> Callable | None:
    """`training.core.step.token_losses`' pick of the targets' logits for `platform`: a gather on XLA:CPU (its
    gradient's scatter beat the masked sum's select there: results/code_choices.md), None (the plain masked
    sum) elsewhere."""
    return xla_cpu.target_logits if is_cpu(platform) else None


def platform_of(model) -> str | None:
    """The platform a `models.Transformer` was configured for (its formulation's; None: this process's backend)."""
    formulation = getattr(model.config, "formulation", None)
    return None if formulation is None else formulation.platform


def grad_norm_every_step(platform: str | None = None) -> bool:
    """Whether the train step computes the logged gradient norm on every step (XLA:CPU) or only on logged
    steps, in a second compiled step (elsewhere)."""
    return is_cpu(platform)
