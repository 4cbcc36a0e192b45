"""`models.Dropout` (two decisions per random word) against Flax's `nn.Dropout`, forward + backward.

    taskset -c 1 python -m bench.dropout --rounds 7   # results/peer.md section 7

At each size's residual-stream activation ([rows x 64, d_model], as bench/peer.py's batches) and
dtype, both layers drop out at rate 0.1 and the gradient flows back through the mask, jitted; the
two alternate in each round (median of the rounds, this process's CPU time). "× flax" is ours /
Flax's time, measured in the same rounds.
"""

from __future__ import annotations

import argparse
import statistics

import flax.linen as nn
import jax
import jax.numpy as jnp

from bench.lib import CLOCKS, SIZES, cpu_description
from models.dropout import Dropout
from training.core.markdown import markdown_row, markdown_table

RATE = 0.1


def step(layer):
    """Jitted (x, key) -> d sum(layer(x) * x) / dx: the mask drawn, applied and back-propagated."""

    def loss(x, key):
        return jnp.sum(layer.apply({}, x, rngs={"dropout": key}).astype(jnp.float32) * x.astype(jnp.float32))

    return jax.jit(jax.grad(loss))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20, help="calls per side per round (fresh keys)")
    parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="cpu")
    args = parser.parse_args()
    now = CLOCKS[args.clock]
    sides = {
        "flax nn.Dropout": step(nn.Dropout(RATE, deterministic=False)),
        "models.Dropout": step(Dropout(RATE, deterministic=False)),
    }
    print(cpu_description())  # the CPU, the releases and the lock
    print(
        f"JAX {jax.__version__}, backend {jax.default_backend()}, rate {RATE}, median of {args.rounds} alternating "
        f"rounds of {args.calls} calls ({args.clock} clock)\n"
    )
    print(markdown_table(["size", "shape", "dtype", "flax ms", "ours ms", "× flax"], [], "lllrrr"))
    for size, (model, rows, length, _) in SIZES.items():
        shape = (rows * length, model["d_model"])
        for dtype in args.dtypes:
            x = jax.random.normal(jax.random.key(0), shape, dtype)
            keys = jax.random.split(jax.random.key(1), args.calls)
            times = {name: [] for name in sides}
            for f in sides.values():
                jax.block_until_ready(f(x, keys[0]))
            for r in range(args.rounds):
                for name in list(sides) if r % 2 == 0 else list(sides)[::-1]:
                    start = now()
                    for key in keys:
                        out = sides[name](x, key)
                    jax.block_until_ready(out)
                    times[name].append((now() - start) * 1e3 / args.calls)
            flax_ms, ours_ms = (statistics.median(times[name]) for name in sides)
            times = [f"{flax_ms:.2f}", f"{ours_ms:.2f}", f"{ours_ms / flax_ms:.2f}"]
            print(markdown_row([size, f"{shape[0]} x {shape[1]}", dtype, *times]), flush=True)


if __name__ == "__main__":
    main()
