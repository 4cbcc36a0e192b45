"""FLOP counts and rates: a matmul's roofline, XLA's count for a compiled program, and the dots of an HLO
module each timed alone.
"""

from __future__ import annotations

import numpy as np

from bench.lib.timing import median_seconds

HLO_DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}


def matmul_flops_per_s(dtype, n=2048, reps=5, clock="wall") -> float:
    """The roofline: FLOP/s of one jitted n x n x n matmul in `dtype`."""
    import jax

    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    seconds = median_seconds(jax.jit(lambda a: a @ a), (a,), reps, clock)
    return 2 * n**3 / seconds


def compiled_flops(lowered) -> float:
    """XLA's FLOP count of a lowered (or compiled) program; NaN where the backend gives none.

    `cost_analysis()` may return None (seen on a GPU), a dict, or a one-dict list (older JAX);
    a missing count makes the MFU columns NaN instead of stopping the bench.
    """
    compiled = lowered.compile() if hasattr(lowered, "compile") else lowered
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else None
    return float((analysis or {}).get("flops", float("nan")))


def hlo_dots(hlo: str) -> list[tuple]:
    """Every `dot` of an optimized HLO module (fused ones too), as (lhs shape, rhs shape, dtypes, dimension numbers);
    `training.run.hlo` reads the text."""
    from training.run.hlo import parse

    return [
        ((d.lhs.dims, d.lhs.dtype), (d.rhs.dims, d.rhs.dtype), d.result.dtype, d.dimension_numbers)
        for d in parse(hlo).dots()
    ]


def dot_seconds(hlo: str, reps: int = 5, clock: str = "cpu") -> tuple[float, float, int]:
    """(seconds, FLOPs, count) of the module's dots, each timed alone as one jitted `lax.dot_general` of its shapes."""
    import jax
    import jax.numpy as jnp

    total_s = total_flops = 0.0
    dots = hlo_dots(hlo)
    for (lhs, lhs_dtype), (rhs, rhs_dtype), out_dtype, numbers in set(dots):
        count = dots.count(((lhs, lhs_dtype), (rhs, rhs_dtype), out_dtype, numbers))
        a, b = jnp.ones(lhs, jnp.dtype(HLO_DTYPES[lhs_dtype])), jnp.ones(rhs, jnp.dtype(HLO_DTYPES[rhs_dtype]))
        out = jnp.dtype(HLO_DTYPES[out_dtype])
        f = jax.jit(lambda a, b, n=numbers, o=out: jax.lax.dot_general(a, b, n, preferred_element_type=o))
        total_s += count * median_seconds(f, (a, b), reps, clock)
        contracted = np.prod([lhs[d] for d in numbers[0][0]])
        out_size = np.prod(jax.eval_shape(f, a, b).shape)
        total_flops += count * 2.0 * out_size * contracted
    return total_s, total_flops, len(dots)
