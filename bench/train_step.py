"""Training-step throughput against Flax examples/wmt, with model FLOPs utilisation.

    taskset -c 0 python -m bench.train_step           # the README table (one core)

For each size and compute dtype: median seconds of a compiled train step (forward, backward,
Adam update) on a full batch of the reference's geometry, slot tokens/s (target side), the
ratio of steps/s to the reference measured on this machine (Flax examples/wmt's step, measured
with bench/flax_wmt_step.py: small 1.27 steps/s at 20 x 64, base 0.191 steps/s at 32 x 64, both float32, one core), and
MFU = compiled FLOPs per step / step time / matmul FLOP/s measured in this same run.
The model's backend hooks (matmuls, attention formulation, dropout draw) are chosen as training chooses them
(`backends.model_hooks` with `config.model.matmul = "auto"`).
"""

from __future__ import annotations

import argparse
import functools
import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

import backends
from bench.timing import median_ms
from models import Transformer, TransformerConfig
from training.core import step as step_lib

# name: (model sizes, rows, length, reference steps/s)
SIZES = {
    "small": (dict(d_model=256, num_heads=4, num_layers=3, mlp_dim=1024), 20, 64, 1.27),
    "base": (dict(d_model=512, num_heads=8, num_layers=6, mlp_dim=2048), 32, 64, 1 / 5.23),
}
VOCAB = 8000


def matmul_flops_per_s(dtype, n=2048, reps=5, clock="wall") -> float:
    """The roofline: FLOP/s of one jitted n x n x n matmul in `dtype`."""
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    f = jax.jit(lambda a: a @ a)
    seconds = median_seconds(f, (a,), reps, clock)
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


# An HLO instruction's result: `%name = f32[2,3]{1,0} op(...)` (ROOT or not; fusion parameters included).
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(?P<name>[\w.-]+) = (?P<dtype>\w+)\[(?P<dims>[\d,]*)\]\S* (?P<op>[\w-]+)\((?P<args>[^)]*)\)(?P<attrs>.*)$")
_DIMS = re.compile(r"(lhs_batch_dims|lhs_contracting_dims|rhs_batch_dims|rhs_contracting_dims)=\{([\d,]*)\}")
HLO_DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16}


def hlo_dots(hlo: str) -> list[tuple]:
    """Every `dot` of an optimized HLO module (fused ones too), as (lhs shape, rhs shape, dtypes, dimension numbers)."""
    shapes, dots = {}, []
    for line in hlo.splitlines():
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        shape = tuple(int(d) for d in m["dims"].split(",") if d)
        shapes[m["name"]] = (shape, m["dtype"])
        if m["op"] == "dot":
            lhs, rhs = (a.split()[-1].lstrip("%") for a in m["args"].split(","))
            dims = {k: tuple(int(d) for d in v.split(",") if d) for k, v in _DIMS.findall(m["attrs"])}
            numbers = ((dims.get("lhs_contracting_dims", ()), dims.get("rhs_contracting_dims", ())),
                       (dims.get("lhs_batch_dims", ()), dims.get("rhs_batch_dims", ())))
            dots.append((shapes[lhs], shapes[rhs], m["dtype"], numbers))
    return dots


def dot_seconds(hlo: str, reps: int = 5, clock: str = "cpu") -> tuple[float, float, int]:
    """(seconds, FLOPs, count) of the module's dots, each timed alone as one jitted `lax.dot_general` of its shapes."""
    total_s = total_flops = 0.0
    dots = hlo_dots(hlo)
    for (lhs, lhs_dtype), (rhs, rhs_dtype), out_dtype, numbers in set(dots):
        count = dots.count(((lhs, lhs_dtype), (rhs, rhs_dtype), out_dtype, numbers))
        a, b = jnp.ones(lhs, HLO_DTYPES[lhs_dtype]), jnp.ones(rhs, HLO_DTYPES[rhs_dtype])
        f = jax.jit(lambda a, b, n=numbers: jax.lax.dot_general(a, b, n, preferred_element_type=HLO_DTYPES[out_dtype]))
        total_s += count * median_seconds(f, (a, b), reps, clock)
        contracted = np.prod([lhs[d] for d in numbers[0][0]])
        out_size = np.prod(jax.eval_shape(f, a, b).shape)
        total_flops += count * 2.0 * out_size * contracted
    return total_s, total_flops, len(dots)


def median_seconds(fn, args, reps, clock="wall"):
    """Seconds of `fn(*args)` on `clock` (bench.timing.CLOCKS; the first two calls compile and warm up)."""
    return median_ms(lambda: jax.block_until_ready(fn(*args)), reps, clock=clock, warmup=2) / 1e3


def bench(size: str, dtype: str, reps: int):
    sizes, rows, length, ref_steps = SIZES[size]
    config = TransformerConfig(vocab_size=VOCAB, dtype=jnp.dtype(dtype), max_len=length, dropout_rate=0.1,
                               **backends.model_hooks("auto", jnp.dtype(dtype)), **sizes)
    model = Transformer(config)
    rng = np.random.default_rng(0)
    tokens = lambda: rng.integers(4, VOCAB, (rows, length), dtype=np.int32)
    batch = {"src": tokens(), "tgt_in": tokens(), "tgt_out": tokens(), "weights": np.ones((rows, length), np.float32)}
    opt = ml_collections.ConfigDict(dict(schedule="rsqrt", learning_rate=1e-3, warmup_steps=100, b1=0.9, b2=0.98, eps=1e-9, grad_clip_norm=1.0))
    state = jax.jit(lambda: step_lib.train_state.TrainState.create(
        apply_fn=model.apply, params=model.init(jax.random.key(0), batch["src"], batch["tgt_in"])["params"],
        tx=step_lib.make_optimizer(opt, 1000)))()
    step = jax.jit(functools.partial(step_lib.train_step, label_smoothing=0.1))
    flops = compiled_flops(step.lower(state, batch, jax.random.key(1)))
    seconds = median_seconds(lambda s: step(s, batch, jax.random.key(1))[1]["loss"], (state,), reps)
    n_params = step_lib.parameter_count(state.params)
    return n_params, rows, length, seconds, flops, ref_steps


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="*", default=list(SIZES))
    parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    rates = {d: matmul_flops_per_s(jnp.dtype(d)) for d in args.dtypes}
    print(f"jax {jax.__version__}, {jax.default_backend()}; matmul 2048^3: "
          + ", ".join(f"{d} {r / 1e9:.0f} GFLOP/s" for d, r in rates.items()) + "\n")
    print("| size | params | compute dtype | batch (rows x len) | step s | target slot tokens/s | steps/s vs reference | GFLOP/step | MFU |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|")
    for size in args.sizes:
        for dtype in args.dtypes:
            n_params, rows, length, seconds, flops, ref_steps = bench(size, dtype, args.reps)
            print(
                f"| {size} | {n_params / 1e6:.2f}M | {dtype} | {rows} x {length} | {seconds:.3f} | "
                f"{rows * length / seconds:,.0f} | {1 / seconds / ref_steps:.2f}x | {flops / 1e9:.1f} | "
                f"{flops / seconds / rates[dtype]:.0%} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
