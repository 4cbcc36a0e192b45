"""The NNX layer under `nnx.jit` against the Linen layer under `jax.jit`: same shapes, same run.

    taskset -c 1 python -m bench.nnx_layer
    taskset -c 1 python -m bench.nnx_layer --rounds 5 --reps 10

Rows: forward+backward of the layer (batch 4, length 256, d_model 256, 8 heads, 2 KV heads,
causal) under `nnx.jit` in its three calling modes (graph mode, the default; tree mode,
`nnx.jit(graph=False)`; graph mode through `nnx.cached_partial`, which caches the graph traversal),
and under `jax.jit` over `nnx.split`'s state (the layer without any per-call graph handling); and
one decode step (batch 8, d_model 512, 8 heads, 2 KV heads, cache 1024 about half full,
one new token per sequence, cache donated: the NNX step is `jax.jit` over `nnx.split`/`nnx.merge`
with the `nnx.Cache` state donated, since `nnx.jit(donate_argnums=...)` would donate the
parameters too); and the same step under `nnx.jit` over the layer itself, neither side donating
its cache; and that nnx.jit step against Flax's own `nnx.MultiHeadAttention` (its cost without
ours). Both layers are built on `attention.attend`; the
ratio (NNX / Linen) shows what `nnx.jit`'s graph handling adds per call. Rounds alternate
NNX and Linen; each entry is the median over rounds of the per-round median times (CPU time
of this process per call; `--clock wall` for wall-clock).
"""

from __future__ import annotations

import argparse
import statistics

import jax
import jax.numpy as jnp
from flax import nnx

import attention
from bench.lib import CLOCKS, median_ms
from training.core.markdown import markdown_row, markdown_table

HEADS, KV_HEADS = 8, 2


TRAIN_MODES = ("graph", "tree", "cached", "split")


def train_pair(batch=4, length=256, width=256, mode="graph"):
    """(nnx_fn, linen_fn): one jitted forward+backward each, on the same parameters and input.

    `mode` (TRAIN_MODES) is how the NNX side is jitted: `nnx.jit` in graph mode, in tree mode
    (`graph=False`), through `nnx.cached_partial`, or `jax.jit` over `nnx.split`'s state and
    `nnx.merge` ('split'), which separates the layer's cost from `nnx.jit`'s.
    """
    x = jax.random.normal(jax.random.key(1), (batch, length, width))
    layer = attention.nnx.MultiHeadAttention(HEADS, width, num_kv_heads=KV_HEADS, rngs=nnx.Rngs(0))
    linen = attention.MultiHeadAttention(num_heads=HEADS, num_kv_heads=KV_HEADS)
    params = attention.nnx.to_linen_params(layer)

    def nnx_step(layer, x):
        return nnx.grad(lambda m: jnp.mean(m(x, is_causal=True) ** 2))(layer)

    @jax.jit
    def linen_step(params, x):
        return jax.grad(lambda p: jnp.mean(linen.apply({"params": p}, x, is_causal=True) ** 2))(params)

    linen_fn = lambda: jax.block_until_ready(linen_step(params, x))
    if mode == "split":
        graphdef, state = nnx.split(layer)
        split_step = jax.jit(
            lambda s, x: jax.grad(lambda s: jnp.mean(nnx.merge(graphdef, s)(x, is_causal=True) ** 2))(s)
        )
        return lambda: jax.block_until_ready(split_step(state, x)), linen_fn
    if mode == "cached":
        cached_step = nnx.cached_partial(nnx.jit(nnx_step), layer)
        return lambda: jax.block_until_ready(cached_step(x)), linen_fn
    jitted = nnx.jit(nnx_step, graph=mode == "graph")
    return lambda: jax.block_until_ready(jitted(layer, x)), linen_fn


def decode_pair(batch=8, length=1024, width=512, pure=False, graph=None):
    """(nnx_fn, linen_fn): one jitted, cache-donated decode step each, cache index from length // 2 on (a few
    dozen steps).

    `pure`: the NNX cache crosses the jit boundary as a plain dict (`nnx.to_pure_dict`) instead
    of an `nnx.State`, whose per-call flattening costs tens of microseconds on a ~1 ms step.
    `graph`: the NNX step is `nnx.jit` over the layer itself, the idiomatic call ("jit"), or
    that through `nnx.cached_partial` ("cached"); neither side donates its cache then
    (`nnx.jit` would donate the parameters with it).
    """
    token = jax.random.normal(jax.random.key(1), (batch, 1, width))
    layer = attention.nnx.MultiHeadAttention(HEADS, width, num_kv_heads=KV_HEADS, decode=True, rngs=nnx.Rngs(0))
    layer.init_cache((batch, length, width))
    layer.cache_index[...] = jnp.full((batch,), length // 2, jnp.int32)
    linen = attention.MultiHeadAttention(num_heads=HEADS, num_kv_heads=KV_HEADS, decode=True)
    variables = linen.init(jax.random.key(0), jnp.ones((batch, length, width)))
    params = attention.nnx.to_linen_params(layer)
    state = {"cache": dict(variables["cache"], cache_index=jnp.array(length // 2, jnp.int32))}

    # nnx.jit(donate_argnums=0) would donate (and delete) the parameters too: split off the cache
    graphdef, nnx_params, cache = nnx.split(layer, nnx.Param, nnx.Cache)

    def nnx_step(cache_in, token):
        if pure:  # every leaf of the template copy is replaced: none is captured as a constant
            template = jax.tree.map(lambda x: x, cache)
            nnx.replace_by_pure_dict(template, cache_in)
            cache_in = template
        model = nnx.merge(graphdef, nnx_params, cache_in)
        cache_out = nnx.state(model, nnx.Cache)
        return model(token), nnx.to_pure_dict(cache_out) if pure else cache_out

    donate = () if graph else 0
    nnx_step = jax.jit(nnx_step, donate_argnums=donate)
    nnx_state = {"cache": nnx.to_pure_dict(cache) if pure else cache}
    linen_step = jax.jit(
        lambda cache, t: linen.apply({"params": params, "cache": cache}, t, mutable=["cache"]), donate_argnums=donate
    )
    graph_step = nnx.jit(lambda layer, t: layer(t))
    if graph == "cached":
        graph_step = nnx.cached_partial(graph_step, layer)

    def nnx_call():
        if graph:
            jax.block_until_ready(graph_step(token) if graph == "cached" else graph_step(layer, token))
            return
        _, nnx_state["cache"] = jax.block_until_ready(nnx_step(nnx_state["cache"], token))

    def linen_call():
        _, updated = linen_step(state["cache"], token)
        state["cache"] = jax.block_until_ready(updated["cache"])

    return nnx_call, linen_call


def flax_nnx_pair(batch=8, length=1024, width=512):
    """(ours_fn, flax_fn): one decode step under `nnx.jit`, our NNX layer against Flax's `nnx.MultiHeadAttention`.

    Same shapes and parameters, caches about half full, no donation: both pay `nnx.jit`'s per-call
    graph handling, so the ratio is the layers' own difference.
    """
    token = jax.random.normal(jax.random.key(1), (batch, 1, width))
    ours = attention.nnx.MultiHeadAttention(HEADS, width, num_kv_heads=KV_HEADS, decode=True, rngs=nnx.Rngs(0))
    theirs = nnx.MultiHeadAttention(HEADS, width, num_kv_heads=KV_HEADS, decode=True, rngs=nnx.Rngs(0))
    for layer in (ours, theirs):
        layer.init_cache((batch, length, width))
    ours.cache_index[...] = jnp.full((batch,), length // 2, jnp.int32)
    theirs.cache_index[...] = jnp.array(length // 2, jnp.int32)
    step = nnx.jit(lambda layer, t: layer(t, decode=True))
    return (lambda: jax.block_until_ready(step(ours, token))), (lambda: jax.block_until_ready(step(theirs, token)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    args = parser.parse_args()
    print(markdown_table(["row", "NNX ms", "Linen (jax.jit) ms", "NNX / Linen"], [], "lrrr"))
    rows = (
        ("forward+backward, nnx.jit (graph mode, the default)", lambda: train_pair(mode="graph")),
        ("forward+backward, nnx.jit(graph=False) (tree mode)", lambda: train_pair(mode="tree")),
        ("forward+backward, nnx.cached_partial(nnx.jit(...), layer)", lambda: train_pair(mode="cached")),
        ("forward+backward, jax.jit over nnx.split", lambda: train_pair(mode="split")),
        ("decode step, jax.jit over nnx.split, cache as nnx.State", decode_pair),
        ("decode step, jax.jit over nnx.split, cache as a pure dict", lambda: decode_pair(pure=True)),
        ("decode step, nnx.jit (graph mode), neither side donating", lambda: decode_pair(graph="jit")),
        ("decode step, nnx.cached_partial(nnx.jit(...), layer), neither donating", lambda: decode_pair(graph="cached")),
    )
    for name, pair in rows:
        nnx_fn, linen_fn = pair()
        times = {"nnx": [], "linen": []}
        for _ in range(args.rounds):  # alternate, so drift hits both
            times["nnx"].append(median_ms(nnx_fn, args.reps, clock=args.clock))
            times["linen"].append(median_ms(linen_fn, args.reps, clock=args.clock))
        a, b = statistics.median(times["nnx"]), statistics.median(times["linen"])
        print(markdown_row([name, f"{a:.2f}", f"{b:.2f}", f"{a / b:.3f}"]))
    ours_fn, flax_fn = flax_nnx_pair()
    times = {"ours": [], "flax": []}
    for _ in range(args.rounds):
        times["ours"].append(median_ms(ours_fn, args.reps, clock=args.clock))
        times["flax"].append(median_ms(flax_fn, args.reps, clock=args.clock))
    a, b = statistics.median(times["ours"]), statistics.median(times["flax"])
    print(
        "\n" + markdown_table(["row", "ours (NNX) ms", "flax.nnx.MultiHeadAttention ms", "ours / Flax's"], [], "lrrr")
    )
    print(markdown_row(["decode step, both under nnx.jit, neither donating", f"{a:.2f}", f"{b:.2f}", f"{a / b:.3f}"]))


if __name__ == "__main__":
    main()
