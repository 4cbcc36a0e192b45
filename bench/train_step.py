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

import jax
import jax.numpy as jnp
import ml_collections

import backends
from bench.lib import SIZES, VOCAB, compiled_flops, cpu_description, matmul_flops_per_s, median_seconds, synthetic_batch
from models import Transformer, TransformerConfig
from training.data.batching import as_arrays
from training.core import step as step_lib
from training.core.markdown import markdown_row, markdown_table


def bench(size: str, dtype: str, reps: int):
    """(parameters, rows, length, median step seconds, XLA's FLOPs a step, the reference's steps/s) at `size`,
    `dtype`."""
    sizes, rows, length, ref_steps = SIZES[size]
    config = TransformerConfig(
        vocab_size=VOCAB,
        dtype=jnp.dtype(dtype),
        max_len=length,
        dropout_rate=0.1,
        **backends.model_hooks("auto", jnp.dtype(dtype)),
        **sizes,
    )
    model = Transformer(config)
    batch = as_arrays(synthetic_batch(rows, length, VOCAB))
    opt = ml_collections.ConfigDict(
        dict(schedule="rsqrt", learning_rate=1e-3, warmup_steps=100, b1=0.9, b2=0.98, eps=1e-9, grad_clip_norm=1.0)
    )
    state = jax.jit(
        lambda: step_lib.train_state.TrainState.create(
            apply_fn=model.apply,
            params=model.init(jax.random.key(0), batch["src"], batch["tgt_in"])["params"],
            tx=step_lib.make_optimizer(opt, 1000),
        )
    )()
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
    print(cpu_description())  # the CPU, the releases and the lock
    print(
        f"jax {jax.__version__}, {jax.default_backend()}; matmul 2048^3: "
        + ", ".join(f"{d} {r / 1e9:.0f} GFLOP/s" for d, r in rates.items())
        + "\n"
    )
    titles = ["size", "params", "compute dtype", "batch (rows x len)", "step s", "target slot tokens/s"]
    print(markdown_table([*titles, "steps/s vs reference", "GFLOP/step", "MFU"], [], "lrllrrrrr"))
    for size in args.sizes:
        for dtype in args.dtypes:
            n_params, rows, length, seconds, flops, ref_steps = bench(size, dtype, args.reps)
            speeds = [f"{seconds:.3f}", f"{rows * length / seconds:,.0f}", f"{1 / seconds / ref_steps:.2f}x"]
            flop = [f"{flops / 1e9:.1f}", f"{flops / seconds / rates[dtype]:.0%}"]
            print(
                markdown_row([size, f"{n_params / 1e6:.2f}M", dtype, f"{rows} x {length}", *speeds, *flop]), flush=True
            )


if __name__ == "__main__":
    main()
