"""XLA:CPU workaround: a `lax.dot_general` for dense layers that keeps bfloat16 matmuls in bfloat16.

XLA:CPU up to jax 0.12.0 ran a 16-bit dot at 16-bit speed only in row-major form, lhs `[M, K]` times
rhs `[K, N]`, and converted any other form -- the `x W^T` and `x^T g` products that autodiff makes
for every dense layer's backward, and the tied logits `y E^T` -- to float32 first. jax 0.12.1's
XLA:CPU keeps such a backward in bfloat16 (YNNPACK fusions), yet this module still runs bf16 train
steps and decoding 11-12 % faster than XLA's dots (results/code_choices.md), so it stays for 16-bit
compute. `row_major_dot_general` reshapes a dense layer's product to `[M, K] @ [K, N]` and gives it a
backward whose two products are row-major too, their transposed operands copied out explicitly by
`transposed`. Its result is float32 (see `row_major_matmul`), so a model using it computes its
matmuls with 16-bit operands and the rest of each layer mostly in float32.

`backends.dense_dot_general("auto")` picks it on XLA:CPU for 16-bit compute, with or without
native bfloat16 dot instructions (`has_native_bf16`): without them the float32 results still spare
the bfloat16 elementwise work and reductions. For float32 compute "auto" takes XLA's own dots,
which measure as fast at jax 0.12.1. Nothing here is imported by `models/`: the training config
picks this function (`backends.dense_dot_general`) and hands it to the model.
"""

from __future__ import annotations

import math
from pathlib import Path

import jax
import jax.numpy as jnp
from jax import lax

# Side of the square tiles `transposed` moves: XLA:CPU's plain 2-D transpose of a 16-bit array
# runs far slower than two passes through 16 x 16 tiles (results/code_choices.md).
_TILE = 16
# /proc/cpuinfo flags of x86 bfloat16 dot instructions (AVX512-BF16, AMX-BF16).
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def has_native_bf16(cpuinfo: str) -> bool:
    """Whether a /proc/cpuinfo text lists a bfloat16 dot instruction among its CPU flags."""
    flags = {
        flag for line in cpuinfo.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[-1].split()
    }
    return any(flag in flags for flag in NATIVE_BF16_FLAGS)


def cpu_has_native_bf16() -> bool:
    """`has_native_bf16` of this machine (False where /proc/cpuinfo cannot be read)."""
    try:
        return has_native_bf16(Path("/proc/cpuinfo").read_text())
    except OSError:
        return False


def transposed(x: jax.Array) -> jax.Array:
    """x: [N, M] -> x^T [M, N], materialised in row-major order.

    A plain `x.T` is only a layout change that XLA folds into the consumer, which is what turns
    a dot into the slow non-row-major form; the optimization barriers keep the copy physical.
    """
    rows, cols = x.shape
    barrier = lax.optimization_barrier
    if rows % _TILE or cols % _TILE:
        return barrier(x.T.reshape(-1)).reshape(cols, rows)
    tiles = barrier(x.reshape(rows // _TILE, _TILE, cols // _TILE, _TILE).transpose(0, 2, 1, 3).reshape(-1))
    tiles = tiles.reshape(rows // _TILE, cols // _TILE, _TILE, _TILE)
    return barrier(tiles.transpose(1, 3, 0, 2).reshape(-1)).reshape(cols, rows)


@jax.custom_vjp
def row_major_matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    """a: [M, K] @ b: [K, N] -> float32 [M, N], with a backward made of row-major products only.

    The product is returned in float32 (bfloat16 operands, float32 results), so the bias add and
    the elementwise work after it, and their gradients' reductions, run in float32: XLA:CPU
    rounds a bfloat16 reduction to bfloat16 after every add, a scalar loop far slower than
    the float32 one (results/code_choices.md).
    """
    return _float32_product(a, b)


def _float32_product(a, b):
    return jnp.dot(a, b, preferred_element_type=jnp.float32)


def _matmul_fwd(a, b):
    return _float32_product(a, b), (a, b)


def _matmul_bwd(residuals, g):
    a, b = residuals
    g = g.astype(a.dtype)
    (m, k), n = a.shape, g.shape[1]
    # a^T g needs one transpose of a [M, K], or else of g [M, N] and of the result, (g^T a)^T:
    # move the fewer elements (a layer's output projection has N < K).
    b_grad = transposed(a) @ g if m * k <= (m + k) * n else transposed(transposed(g) @ a)
    return g @ transposed(b), b_grad


row_major_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def row_major_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    """`lax.dot_general` for dense layers and tied logits (Flax's `dot_general=` hook).

    Products that contract lhs's trailing axes with rhs's leading ones (`x W`: every `Dense` /
    `DenseGeneral` projection) or with rhs's trailing ones (`y E^T`: logits tied to an embedding
    table `E [vocab, D]`, whose transpose is copied out by `transposed`), with no batch axes,
    requested precision or output type, run as one `row_major_matmul` of the flattened operands,
    cast to their common dtype, with a float32 result; anything else goes to `lax.dot_general`
    unchanged.
    """
    (lhs_contract, rhs_contract), batch = dimension_numbers
    lhs_contract = tuple(d % lhs.ndim for d in lhs_contract)
    rhs_contract = tuple(d % rhs.ndim for d in rhs_contract)
    n = len(lhs_contract)
    rhs_leading, rhs_trailing = tuple(range(n)), tuple(range(rhs.ndim - n, rhs.ndim))
    dense_form = (
        lhs_contract == tuple(range(lhs.ndim - n, lhs.ndim))
        and rhs_contract in (rhs_leading, rhs_trailing)
        and batch == ((), ())
        and preferred_element_type is None
        and precision is None
    )
    if not dense_form:
        return lax.dot_general(
            lhs, rhs, dimension_numbers, precision=precision, preferred_element_type=preferred_element_type
        )
    dtype = jnp.result_type(lhs, rhs)
    k = math.prod(lhs.shape[lhs.ndim - n :])
    if rhs_contract == rhs_leading:  # rhs [K..., N...]
        kernel, free = rhs.reshape(k, -1).astype(dtype), rhs.shape[n:]
    else:  # rhs [N..., K...]
        kernel, free = transposed(rhs.reshape(-1, k).astype(dtype)), rhs.shape[: rhs.ndim - n]
    out = row_major_matmul(lhs.reshape(-1, k).astype(dtype), kernel)
    return out.reshape(lhs.shape[: lhs.ndim - n] + free)
