"""The attention family at long N: forward+backward time and XLA's planned memory, against exact attention.

    taskset -c 1 python -m bench.attention_family --lengths 1024 4096 --reps 3   # results/attention_family.md

For each N and causal / not, every member's attention core (its module on q, k, v `[1, N, 8, 64]`,
its parameters passed in as in training, gradients w.r.t. q, k, v) and the exact references:
`jax.nn.dot_product_attention` (XLA, the ratio's denominator) and `impl="blockwise"`. Rounds
alternate over the formulations (one call each per round, median over `--reps` rounds), all in
this process on one core; `--clock cpu` (default) counts this process's CPU time only. Memory is
XLA's plan for the compiled forward+backward (temporaries + outputs, `memory_analysis()`), not a
measured peak; a formulation planned above `--max_gib` is compiled for its plan but not run (dense
attention and entmax at N = 16384 plan 32 GiB), and its time ratios are then left blank. Members that
cannot be causal (linformer) are left out of the causal rows; MLA's core is exact attention
(its gain is the cache, `attention.family.cache_elements_per_token`), so it is not timed here.
Members run with `experiments.lib.member_options` at each N, the settings the experiments train
with. `--members performer lsh` times only those members (beside the exact references, which always run).
`--window 256` adds Longformer's sliding window (Beltagy et al. 2020): exact attention to keys
within ±256 positions (causal: the 256 before), on the blockwise kernel, which skips the blocks
outside the band (`local_window_size`, not a family member: every `impl` honours it).
Where `tokamax` is installed (`pip install -e ".[bench]"`; not a dependency of the library), its CPU `xla_chunked`
exact attention runs too, an outside reference for the blockwise kernel.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics

import jax
import jax.numpy as jnp

import attention
from attention import family
from bench.lib import CLOCKS, cpu_description
from experiments.lib import member_options
from training.core.markdown import markdown_row, markdown_table

B, H, D = 1, 8, 64


def timed_members(causal: bool = False) -> list[str]:
    """The family members whose attention core is timed here (not the projecting ones, such as MLA)."""
    return [
        name
        for name, spec in family.ATTENTION_TYPES.items()
        if spec is not None and not spec.projects and (spec.causal or not causal)
    ]


def formulations(N: int, causal: bool, q, k, v, members=None, window=None):
    """{name: (jitted forward+backward (q, k, v, params) -> grads w.r.t. q, k, v; the params to pass)};
    `members`: the family members to include (None: all); `window`: also the sliding window of
    ±`window` keys on the blockwise kernel.

    A member's parameters are arguments of the jitted step, as in training, not constants: closed over,
    entmax's α = 1.5 made XLA fold its `pow` into a square, a shortcut a learned α never gets.
    """
    out = {
        "xla": (lambda q, k, v, _: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="xla"), {}),
        "blockwise": (
            lambda q, k, v, _: attention.dot_product_attention(q, k, v, is_causal=causal, impl="blockwise"),
            {},
        ),
    }
    if window is not None:
        out[f"window ±{window} (blockwise)"] = (
            lambda q, k, v, _: attention.dot_product_attention(
                q, k, v, is_causal=causal, impl="blockwise", local_window_size=(window, window)
            ),
            {},
        )
    if importlib.util.find_spec("tokamax") is not None:
        import tokamax

        out["tokamax xla_chunked"] = (
            lambda q, k, v, _: tokamax.dot_product_attention(q, k, v, is_causal=causal, implementation="xla_chunked"),
            {},
        )
    for name in timed_members(causal):
        if members is not None and name not in members:
            continue
        spec = family.ATTENTION_TYPES[name]
        module = spec.module(**member_options(name, N))
        # jitted, so the forward pass init runs on the way is dead code: eager, span and entmax build their
        # [H, N, N] logits at N = 16384 (8 GiB each) and the process was killed for memory
        params = jax.jit(module.init, static_argnames="is_causal")(jax.random.key(0), q, k, v, is_causal=causal)
        key_of = (lambda q, k: q) if spec.shared_qk else (lambda q, k: k)
        out[name] = (
            (lambda module, key_of: lambda q, k, v, params: module.apply(params, q, key_of(q, k), v, is_causal=causal))(
                module, key_of
            ),
            params,
        )
    grads = lambda f: jax.jit(jax.grad(lambda q, k, v, p: jnp.sum(f(q, k, v, p) ** 2), argnums=(0, 1, 2)))
    return {name: (grads(f), params) for name, (f, params) in out.items()}


def planned_gib(step, params, q, k, v) -> float:
    stats = step.lower(q, k, v, params).compile().memory_analysis()
    if stats is None:  # a backend without XLA's memory plan: no plan, so nothing is held back from running
        return float("nan")
    return (stats.temp_size_in_bytes + stats.output_size_in_bytes) / 2**30


def run(lengths, reps, clock, max_gib, members=None, window=None):
    now = CLOCKS[clock]
    titles = ["N", "causal", "formulation", "fwd+bwd ms", "× xla", "× blockwise", "planned GiB", "× xla memory"]
    print(markdown_table(titles, []))
    for N in lengths:
        keys = jax.random.split(jax.random.key(N), 3)
        q, k, v = (jax.random.normal(kk, (B, N, H, D), jnp.float32) for kk in keys)
        for causal in (False, True):
            steps = formulations(N, causal, q, k, v, members, window)
            memory = {name: planned_gib(step, params, q, k, v) for name, (step, params) in steps.items()}
            runnable = {
                name: spec for name, spec in steps.items() if not memory[name] > max_gib
            }  # NaN: no plan, run it
            times = {name: [] for name in runnable}
            for name, (step, params) in runnable.items():  # warm-up (compile)
                jax.block_until_ready(step(q, k, v, params))
            for _ in range(reps):  # alternating rounds
                for name, (step, params) in runnable.items():
                    start = now()
                    jax.block_until_ready(step(q, k, v, params))
                    times[name].append((now() - start) * 1e3)
            ms = {name: statistics.median(t) for name, t in times.items()}
            ratio = lambda name, to: f"{ms[name] / ms[to]:.2f}" if name in ms and to in ms else ""
            for name in steps:
                timed = f"{ms[name]:.0f}" if name in ms else f"not run: plans > {max_gib:g} GiB"
                planned = [f"{memory[name]:.3f}", f"{memory[name] / memory['xla']:.2f}"]
                print(
                    markdown_row([N, causal, name, timed, ratio(name, "xla"), ratio(name, "blockwise"), *planned]),
                    flush=True,
                )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", nargs="*", type=int, default=[1024, 4096, 16384])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="cpu")
    parser.add_argument(
        "--max_gib", type=float, default=8.0, help="run only formulations XLA plans at most this much memory for"
    )
    parser.add_argument("--members", nargs="*", default=None, help="family members to time (default: all)")
    parser.add_argument("--window", type=int, default=None, help="also time a sliding window of ± this many keys")
    args = parser.parse_args()
    unknown = set(args.members or ()) - set(timed_members())
    if unknown:
        parser.error(f"--members {sorted(unknown)}: expected members of {timed_members()}")
    if args.window is not None and args.window < 0:
        parser.error(f"--window must be >= 0, got {args.window}")
    print(cpu_description())  # the CPU, the releases and the lock
    print(
        f"JAX {jax.__version__}, backend {jax.default_backend()}, [B, N, H, d] = [{B}, N, {H}, {D}], float32, "
        f"median of {args.reps} alternating rounds ({args.clock} clock)\n"
    )
    run(args.lengths, args.reps, args.clock, args.max_gib, args.members, args.window)


if __name__ == "__main__":
    main()
