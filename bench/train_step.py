"""Training-step throughput against Flax examples/wmt, with model FLOPs utilisation.

    taskset -c 0 python -m bench.train_step           # the README table (one core)

For each size and compute dtype: median seconds of a compiled train step (forward, backward,
Adam update) on a full batch of the reference's geometry, slot tokens/s (target side), the
ratio of steps/s to the reference measured on this machine (../shared/GUIDE.md section 2:
small 1.27 steps/s at 20 x 64, base 0.191 steps/s at 32 x 64, both float32, one core), and
MFU = compiled FLOPs per step / step time / matmul FLOP/s measured in this same run.
The model's matmuls are chosen as `config.model.matmul = "auto"` chooses them (backends/__init__.py).
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

import backends
from bench.timing import median_ms
from models import Transformer, TransformerConfig
from training.run import step as step_lib

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


def median_seconds(fn, args, reps, clock="wall"):
    """Seconds of `fn(*args)` on `clock` (bench.timing.CLOCKS; the first two calls compile and warm up)."""
    return median_ms(lambda: jax.block_until_ready(fn(*args)), reps, clock=clock, warmup=2) / 1e3


def bench(size: str, dtype: str, reps: int):
    sizes, rows, length, ref_steps = SIZES[size]
    config = TransformerConfig(vocab_size=VOCAB, dtype=jnp.dtype(dtype), max_len=length, dropout_rate=0.1,
                               dot_general=backends.dense_dot_general("auto", jnp.dtype(dtype)), **sizes)
    model = Transformer(config)
    rng = np.random.default_rng(0)
    tokens = lambda: rng.integers(4, VOCAB, (rows, length), dtype=np.int32)
    batch = {"src": tokens(), "tgt_in": tokens(), "tgt_out": tokens(), "weights": np.ones((rows, length), np.float32)}
    opt = ml_collections.ConfigDict(dict(schedule="rsqrt", learning_rate=1e-3, warmup_steps=100, b1=0.9, b2=0.98, eps=1e-9, grad_clip_norm=1.0))
    state = jax.jit(lambda: step_lib.train_state.TrainState.create(
        apply_fn=model.apply, params=model.init(jax.random.key(0), batch["src"], batch["tgt_in"])["params"],
        tx=step_lib.make_optimizer(opt, 1000)))()
    step = jax.jit(functools.partial(step_lib.train_step, label_smoothing=0.1))
    flops = step.lower(state, batch, jax.random.key(1)).compile().cost_analysis()["flops"]
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
