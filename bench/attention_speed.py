r"""Attention speed and memory: every `impl` against `jax.nn` (XLA) measured in the same run.

    taskset -c 1 python -m bench.attention_speed --reps 3 --impls vmap einsum blockwise auto xla \
        --torch-python /tmp/torchvenv/bin/python              # the README speed table
    taskset -c 1 python -m bench.attention_speed --shapes 1,2048,8,64,8 --blocks 256x256 512x512
    taskset -c 1 python -m bench.attention_speed --memory 8192 16384   # peak memory, fresh process per point
    taskset -c 1 python -m bench.attention_speed --compiled-memory 8192 16384 --impls blockwise  # XLA's plan

Speed: a markdown table of median milliseconds of the jitted forward and forward+backward
(gradients w.r.t. q, k, v), causal and not, for each formulation, with the ratio to
`jax.nn.dot_product_attention(implementation="xla")` on the same shape (lower is faster) and
to `torch.nn.functional.scaled_dot_product_attention` on the same core, timed by
`bench.torch_sdpa` in a child process of `--torch-python` (torch's CPU wheel may need another
Python than JAX's; the default is this Python when it has torch; without torch the column is
n/a). `--clock cpu` (default) times with the process's CPU time, which on a core shared with
other jobs counts only this process's work; `--clock wall` times wall-clock.

Memory: each (formulation, N, causal) point runs one forward+backward in a fresh Python
process and reports its peak resident set (`ru_maxrss`), and the same process's peak before
the computation (imports and inputs). Dense formulations are not run past N = 8192 (they need
O(N^2) memory: about 24 GiB at 16384).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys

import jax
import jax.numpy as jnp

import attention
from bench.lib import CLOCKS, ROOT, cpu_description, median_ms
from training.core.markdown import markdown_row, markdown_table

# (batch, length, query heads, head dim, kv heads)
DEFAULT_SHAPES = (
    (8, 128, 8, 64, 8),
    (4, 512, 8, 64, 8),
    (2, 1024, 8, 64, 8),  # where impl="auto" switches
    (1, 2048, 8, 64, 8),
    (1, 4096, 8, 64, 8),
    (1, 8192, 8, 64, 8),
)
IMPLS = ("vmap", "einsum", "blockwise", "auto", "xla")
DEFAULT_IMPLS = ("vmap", "blockwise")  # einsum and xla track the reference (results/attention_bench.md)
DENSE = ("reference", "vmap", "einsum", "xla")
MAX_DENSE_MEMORY_N = 8192


def formulation(name, causal, blocks=None):
    """A function (q, k, v) -> out for a formulation name ("reference", an impl, "loop")."""
    if name == "reference":
        return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="xla")
    if name == "loop":
        return lambda q, k, v: head_loop(q, k, v, causal)
    sizes = {} if blocks is None else dict(block_q=blocks[0], block_k=blocks[1])
    return lambda q, k, v: attention.dot_product_attention(q, k, v, is_causal=causal, impl=name, **sizes)


def head_loop(q, k, v, causal):
    """A Python loop over query heads: one single-head call each (unrolled under jit)."""
    group = q.shape[-2] // k.shape[-2]
    heads = [
        attention.dot_product_attention(
            q[..., h : h + 1, :],
            k[..., h // group : h // group + 1, :],
            v[..., h // group : h // group + 1, :],
            is_causal=causal,
        )
        for h in range(q.shape[-2])
    ]
    return jnp.concatenate(heads, axis=-2)


def inputs(shape, dtype):
    B, N, H, D, G = shape
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (B, N, H, D), dtype)
    k = jax.random.normal(keys[1], (B, N, G, D), dtype)
    v = jax.random.normal(keys[2], (B, N, G, D), dtype)
    cotangent = jax.random.normal(keys[3], (B, N, H, D), dtype)
    return q, k, v, cotangent


def jax_timings(fn, args, cotangent, reps, clock):
    """The cotangent is an argument, not a closed-over constant XLA would fold at compile time."""
    forward = jax.jit(fn)
    loss = lambda q, k, v, c: jnp.sum(fn(q, k, v).astype(jnp.float32) * c.astype(jnp.float32))
    backward = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    time_ms = lambda f, a: median_ms(lambda: jax.block_until_ready(f(*a)), reps, clock=clock)
    return time_ms(forward, args), time_ms(backward, (*args, cotangent))


def torch_timings(torch_python, shape, causal, reps, dtype, clock):
    """torch SDPA at this shape, timed by bench.torch_sdpa under `torch_python` (same core)."""
    if torch_python is None:
        return None
    command = [
        torch_python,
        "-m",
        "bench.torch_sdpa",
        ",".join(map(str, shape)),
        "--reps",
        str(reps),
        "--dtype",
        str(dtype),
        "--clock",
        clock,
    ] + ["--causal"] * causal
    result = json.loads(subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT).stdout)
    return result["forward_ms"], result["forward_backward_ms"]


def torch_version(torch_python):
    if torch_python is None:
        return None
    command = [torch_python, "-c", "import torch; print(torch.__version__)"]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()


def speed_table(shapes, names, blocks_list, reps, dtype, clock, torch_python):
    titles = ["B, N, H, Dk, G", "causal", "formulation", "fwd ms", "fwd ratio", "fwd+bwd ms", "fwd+bwd ratio"]
    print(markdown_table([*titles, "fwd vs torch", "fwd+bwd vs torch"], [], "lll" + "r" * 6))
    speeds = lambda t, ref: [f"{t[0]:.1f}", f"{t[0] / ref[0]:.2f}", f"{t[1]:.1f}", f"{t[1] / ref[1]:.2f}"]
    for shape in shapes:
        q, k, v, cotangent = inputs(shape, dtype)
        point = ", ".join(map(str, shape))
        for causal in (False, True):
            if "auto" not in names:
                print(
                    markdown_row([point, causal, f"impl='auto' picks {auto_choice(shape, causal, dtype)}"] + [""] * 6)
                )
            torch_ms = torch_timings(torch_python, shape, causal, reps, dtype, clock)
            rows = [("reference", None)] + [(n, None) for n in names] + [("blockwise", b) for b in blocks_list]
            ref = None
            for name, blocks in rows:
                times = jax_timings(formulation(name, causal, blocks), (q, k, v), cotangent, reps, clock)
                ref = ref or times
                label = label_of(name, blocks, shape, causal, dtype)
                vs_torch = (
                    ("n/a", "n/a") if torch_ms is None else tuple(f"{t / r:.2f}" for t, r in zip(times, torch_ms))
                )
                print(markdown_row([point, causal, label, *speeds(times, ref), *vs_torch]), flush=True)
            if torch_ms is not None:
                print(markdown_row([point, causal, "torch SDPA", *speeds(torch_ms, ref), "1.00", "1.00"]), flush=True)


def label_of(name, blocks, shape, causal, dtype):
    if name == "reference":
        return "jax.nn xla (reference)"
    if name == "loop":
        return "python loop over heads"
    if blocks is not None:
        return f"headcount blockwise {blocks[0]}x{blocks[1]}"
    if name == "auto":
        return f"headcount auto (= {auto_choice(shape, causal, dtype)})"
    return f"headcount {name}"


def auto_choice(shape, causal, dtype):
    _, N, _, D, _ = shape
    return attention.choose_impl(N, N, dtype, D, D, False, False, skips_blocks=causal)


def memory_point(name, N, causal, dtype):
    """Child process: one jitted forward+backward at (1, N, 8, 64); print peak RSS in bytes."""
    q, k, v, cotangent = inputs((1, N, 8, 64, 8), jnp.dtype(dtype))
    jax.block_until_ready((q, k, v, cotangent))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    fn = formulation(name, causal)
    loss = lambda q, k, v, c: jnp.sum(fn(q, k, v).astype(jnp.float32) * c.astype(jnp.float32))
    jax.block_until_ready(jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v, cotangent))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"before": before, "peak": peak}))


def compiled_memory_table(lengths, names, dtype):
    """XLA's buffer plan for one jitted forward+backward: compiles, never runs (safe at any N)."""
    titles = ["formulation", "N", "causal", "arguments + outputs GiB", "temporaries GiB", "total GiB"]
    print(markdown_table(titles, [], "lrlrrr"))
    for N in lengths:
        q, k, v, cotangent = jax.eval_shape(lambda: inputs((1, N, 8, 64, 8), jnp.dtype(dtype)))
        for causal in (False, True):
            for name in ["reference", *names]:
                fn = formulation(name, causal)
                loss = lambda q, k, v, fn=fn: jnp.sum(
                    fn(q, k, v).astype(jnp.float32) * jnp.ones(cotangent.shape, jnp.float32)
                )
                stats = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v).compile().memory_analysis()
                if stats is None:  # a backend without XLA's memory plan
                    print(markdown_row([name, N, causal, "no memory_analysis() on this backend", "", ""]), flush=True)
                    continue
                io = stats.argument_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
                label = "jax.nn xla (reference)" if name == "reference" else f"headcount {name}"
                gib = lambda b: b / 2**30
                sizes = (io, stats.temp_size_in_bytes, io + stats.temp_size_in_bytes)
                print(markdown_row([label, N, causal, *(f"{gib(b):.3f}" for b in sizes)]), flush=True)


def memory_table(lengths, names, dtype):
    titles = ["formulation", "N", "causal", "peak RSS GiB", "before the computation GiB", "peak - before GiB"]
    print(markdown_table(titles, [], "lrlrrr"))
    for N in lengths:
        for causal in (False, True):
            for name in ["reference", *names]:
                label = "jax.nn xla (reference)" if name == "reference" else f"headcount {name}"
                dense = name in DENSE or (
                    name == "auto" and auto_choice((1, N, 8, 64, 8), causal, dtype) != "blockwise"
                )
                if dense and N > MAX_DENSE_MEMORY_N:
                    print(markdown_row([label, N, causal, "not run (dense: O(N²) memory)", "", ""]), flush=True)
                    continue
                command = [
                    sys.executable,
                    "-m",
                    "bench.attention_speed",
                    "--memory-point",
                    name,
                    str(N),
                    str(causal),
                    dtype,
                ]
                result = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT)
                usage = json.loads(result.stdout.strip().splitlines()[-1])
                gib = lambda b: b / 2**30
                sizes = (usage["peak"], usage["before"], usage["peak"] - usage["before"])
                print(markdown_row([label, N, causal, *(f"{gib(b):.2f}" for b in sizes)]), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="*", help="B,N,H,Dk,G tuples (default: the README's)")
    parser.add_argument(
        "--impls",
        nargs="*",
        default=list(DEFAULT_IMPLS),
        help=f"formulations besides the reference: {IMPLS} and 'loop'",
    )
    parser.add_argument(
        "--blocks", nargs="*", default=[], help="extra blockwise rows with these block sizes, e.g. 256x256"
    )
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions per point (median)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    parser.add_argument(
        "--torch-python", help="a Python with torch for the torch SDPA column (default: this one, if it has torch)"
    )
    parser.add_argument("--memory", nargs="*", type=int, help="peak-memory table at these N instead of the speed table")
    parser.add_argument("--memory-point", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument(
        "--compiled-memory", nargs="*", type=int, help="XLA's planned forward+backward memory at these N (compile only)"
    )
    args = parser.parse_args()
    if args.memory_point:
        name, N, causal, dtype = args.memory_point
        return memory_point(name, int(N), causal == "True", dtype)
    dtype = jnp.dtype(args.dtype)
    print(cpu_description())  # the CPU, the releases and the lock
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, {args.dtype}, ", end="")
    if args.compiled_memory:
        print("XLA memory_analysis() of the compiled forward+backward, nothing run\n")
        return compiled_memory_table(args.compiled_memory, args.impls, args.dtype)
    if args.memory:
        # glibc's heap policy decides how much of the freed scratch comes back (results/memory_bench.md)
        threshold = os.environ.get("MALLOC_MMAP_THRESHOLD_", "glibc's default (dynamic)")
        print(f"one forward+backward per fresh process; MALLOC_MMAP_THRESHOLD_ {threshold}\n")
        return memory_table(args.memory, args.impls, args.dtype)
    torch_python = args.torch_python or (sys.executable if importlib.util.find_spec("torch") else None)
    version = torch_version(torch_python)
    torch_note = f"torch {version} (1 thread)" if version else "no torch (vs-torch columns n/a; see --torch-python)"
    print(f"median of {args.reps}, {args.clock} clock, {torch_note}\n")
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes] if args.shapes else DEFAULT_SHAPES
    blocks = [tuple(int(x) for x in b.split("x")) for b in args.blocks]
    speed_table(shapes, args.impls, blocks, args.reps, dtype, args.clock, torch_python)


if __name__ == "__main__":
    main()
