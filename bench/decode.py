"""Decode-step speed and KV-cache size: MHA, GQA and MQA against Flax's decode cache, same run.

    taskset -c 1 python -m bench.decode                 # the README table
    taskset -c 1 python -m bench.decode --lengths 1024 --reps 10

One step is one jitted layer call on one new token per sequence (batch 8, d_model 512, 8 query
heads, projections included) with the cache half full, its cache passed in and returned.
"donated" jits the step with the cache donated (XLA writes the new key/value into the same
buffer); "copied" jits it without donation (the whole cache is copied every step). The
reference is `flax.linen.MultiHeadDotProductAttention(decode=True)` at the same batch, width and
cache length, donated too; Flax's cache is `[B, L, H, Dk]` and has no GQA, so its row is MHA.
`--family` adds the attention family's decoding members (`attention_type`, their default
settings): entmax and span over the layer's KV cache, performer over its fixed-size state (the
same bytes at every length), mla over its latent cache. Times are medians of the process's CPU
time per step (`--clock wall` for wall-clock).

    taskset -c 1 python -m bench.decode --family --lengths 1024 4096 16384   (results/attention_family.md)
"""

from __future__ import annotations

import argparse

import flax.linen as nn
import jax
import jax.numpy as jnp

import attention
import backends
from attention import family
from bench.lib import CLOCKS, cpu_description, median_ms
from training.core.markdown import markdown_row, markdown_table

BATCH, WIDTH, HEADS = 8, 512, 8
# the attention formulation training picks for this backend (backends.model_hooks)
FORMULATION = backends.model_hooks("auto", jnp.float32)["formulation"]


def is_index(path) -> bool:
    return getattr(path[-1], "key", None) == "cache_index"


def cache_bytes(cache):
    """Bytes of every cached array but the write indices (a member's cache may be nested)."""
    return sum(x.nbytes for path, x in jax.tree_util.tree_leaves_with_path(cache) if not is_index(path))


def step_ms(layer, length, reps, donate, clock):
    """Median time of one decode step at cache index length // 2; returns (ms, cache bytes)."""
    x = jnp.ones((BATCH, length, WIDTH), jnp.float32)
    variables = jax.jit(layer.init)(jax.random.key(0), x)  # jitted: XLA drops the unused full-length attention
    params = variables["params"]
    half = jnp.array(length // 2, jnp.int32)
    cache = jax.tree_util.tree_map_with_path(lambda path, x: half if is_index(path) else x, variables["cache"])
    token = jax.random.normal(jax.random.key(1), (BATCH, 1, WIDTH))

    def step(params, cache, token):
        out, updated = layer.apply({"params": params, "cache": cache}, token, mutable=["cache"])
        return out, updated["cache"]

    step = jax.jit(step, donate_argnums=(1,) if donate else ())
    size = cache_bytes(cache)

    def run():  # the cache each step returns is the next step's (donated) input
        nonlocal cache
        out, cache = step(params, cache, token)
        jax.block_until_ready((out, cache))

    return median_ms(run, reps, clock=clock, warmup=2), size


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", nargs="*", type=int, default=[1024, 4096])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    parser.add_argument("--family", action="store_true", help="add the attention family's decoding members")
    args = parser.parse_args()
    print(cpu_description())  # the CPU, the releases and the lock
    print(
        f"jax {jax.__version__}, backend {jax.default_backend()}, float32, batch {BATCH}, d_model {WIDTH}, "
        f"{HEADS} query heads, median of {args.reps} steps, {args.clock} clock\n"
    )
    titles = ["layer", "KV heads", "cache length", "KV cache MiB", "ms/token donated", "vs Flax", "ms/token copied"]
    print(markdown_table([*titles, "copied / donated"], [], "l" + "r" * 7))
    layers = [
        (
            "flax MultiHeadDotProductAttention (reference)",
            HEADS,
            nn.MultiHeadDotProductAttention(num_heads=HEADS, decode=True),
        )
    ]
    for name, kv_heads in (("MHA", HEADS), ("GQA", 2), ("MQA", 1)):
        layers.append(
            (
                f"headcount {name}",
                kv_heads,
                attention.MultiHeadAttention(
                    num_heads=HEADS, num_kv_heads=kv_heads, decode=True, formulation=FORMULATION
                ),
            )
        )
    if args.family:
        for name, spec in family.ATTENTION_TYPES.items():
            if spec is not None and spec.decode is not None:
                layers.append(
                    (
                        f"headcount {name}",
                        HEADS,
                        attention.MultiHeadAttention(
                            num_heads=HEADS, decode=True, attention_type=name, formulation=FORMULATION
                        ),
                    )
                )
    for length in args.lengths:
        reference = None
        for name, kv_heads, layer in layers:
            donated, size = step_ms(layer, length, args.reps, True, args.clock)
            copied, _ = step_ms(layer, length, args.reps, False, args.clock)
            reference = reference or donated
            times = [f"{donated:.3f}", f"{donated / reference:.3f}", f"{copied:.3f}", f"{copied / donated:.2f}"]
            print(markdown_row([name, kv_heads, length, f"{size / 2**20:.1f}", *times]), flush=True)


if __name__ == "__main__":
    main()
