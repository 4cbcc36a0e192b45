"""Attention speed: every `impl`, a Python loop over heads, against `jax.nn` (XLA) in the same run.

    taskset -c 0 python bench/attention.py            # the README table (one core)
    python bench/attention.py --shapes 8,128,8,64,8 --reps 3

Prints a markdown table: median milliseconds of the jitted forward and forward+backward
(gradients w.r.t. q, k, v) for each formulation, and the ratio to
`jax.nn.dot_product_attention(implementation="xla")` on the same shape (lower is faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file, bench/ would shadow the `attention` package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import jax
import jax.numpy as jnp

import attention

# (batch, length, query heads, head dim, kv heads)
DEFAULT_SHAPES = (
    (8, 128, 8, 64, 8),
    (4, 512, 8, 64, 8),
    (1, 2048, 8, 64, 8),
    (4, 512, 8, 64, 2),
    (4, 512, 8, 64, 1),
)


def reference(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, implementation="xla")


def head_loop(q, k, v):
    """A Python loop over query heads: one single-head call each (unrolled under jit)."""
    group = q.shape[-2] // k.shape[-2]
    heads = [
        attention.dot_product_attention(
            q[..., h : h + 1, :], k[..., h // group : h // group + 1, :], v[..., h // group : h // group + 1, :]
        )
        for h in range(q.shape[-2])
    ]
    return jnp.concatenate(heads, axis=-2)


def formulations():
    yield "jax.nn xla (reference)", reference
    for impl in ("vmap", "einsum", "xla"):
        yield f"headcount {impl}", lambda q, k, v, impl=impl: attention.dot_product_attention(q, k, v, impl=impl)
    yield "python loop over heads", head_loop


def median_ms(fn, args, reps):
    jax.block_until_ready(fn(*args))  # compile
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def bench_shape(shape, reps, dtype):
    B, N, H, D, G = shape
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (B, N, H, D), dtype)
    k = jax.random.normal(keys[1], (B, N, G, D), dtype)
    v = jax.random.normal(keys[2], (B, N, G, D), dtype)
    cotangent = jax.random.normal(keys[3], (B, N, H, D), dtype)
    rows = []
    for name, fn in formulations():
        forward = jax.jit(fn)
        loss = lambda q, k, v, fn=fn: jnp.sum(fn(q, k, v) * cotangent)
        backward = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        rows.append((name, median_ms(forward, (q, k, v), reps), median_ms(backward, (q, k, v), reps)))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="*", help="B,N,H,Dk,G tuples (default: the README's)")
    parser.add_argument("--reps", type=int, default=7, help="timed repetitions per point (median)")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes] if args.shapes else DEFAULT_SHAPES
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, {args.dtype}, median of {args.reps}\n")
    print("| B, N, H, Dk, G | formulation | fwd ms | fwd ratio | fwd+bwd ms | fwd+bwd ratio |")
    print("|---|---|---:|---:|---:|---:|")
    for shape in shapes:
        rows = bench_shape(shape, args.reps, jnp.dtype(args.dtype))
        ref_fwd, ref_bwd = rows[0][1], rows[0][2]
        for name, fwd, bwd in rows:
            print(
                f"| {', '.join(map(str, shape))} | {name} | {fwd:.2f} | {fwd / ref_fwd:.2f} "
                f"| {bwd:.2f} | {bwd / ref_bwd:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
