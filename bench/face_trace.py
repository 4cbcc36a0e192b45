"""Follow one call of each attention face through the project's files: how often a face calls out, how many hops.

    python -m bench.face_trace

Traces (`sys.setprofile`) one eager `apply` of a GQA layer (4 query heads, 2 KV heads) for each face,
the Linen `attention.MultiHeadAttention` and the NNX `attention.nnx.MultiHeadAttention`, after its
initialisation (not traced), and counts the Python calls whose callee is in one of the project's files:

  calls out of the face -- calls made from the face's file into another of the project's files;
  hops                  -- calls whose caller and callee are in two different project files;
  files                 -- the project files the call passed through.

What runs inside JAX and Flax is not counted (their files are not the project's), only where the path
re-enters the project from them. The figures describe the code's shape, not its speed.
"""

from __future__ import annotations

import collections
import pathlib
import sys

import jax
import jax.numpy as jnp

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("attention", "models", "backends", "training")


def project_file(filename: str) -> str | None:
    """`filename` relative to the repository if it is one of the project's package files, else None."""
    try:
        relative = pathlib.Path(filename).resolve().relative_to(ROOT)
    except ValueError:
        return None
    return str(relative) if relative.parts[0] in PACKAGES else None


def trace(run, face: str) -> dict:
    """Run `run()` under a profiler; the calls out of `face` (a project file), by callee, and the hops."""
    out: collections.Counter = collections.Counter()
    hops, files = 0, set()

    def profile(frame, event, arg):
        nonlocal hops
        if event != "call":
            return
        callee = project_file(frame.f_code.co_filename)
        if callee is None:
            return
        files.add(callee)
        # the nearest project frame below this one is the caller (JAX/Flax frames in between are skipped)
        caller_frame = frame.f_back
        while caller_frame is not None and project_file(caller_frame.f_code.co_filename) is None:
            caller_frame = caller_frame.f_back
        caller = None if caller_frame is None else project_file(caller_frame.f_code.co_filename)
        if caller is not None and caller != callee:
            hops += 1
            if caller == face:
                out[f"{callee}:{frame.f_code.co_name}"] += 1

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return {"calls_out": sum(out.values()), "by_callee": dict(out), "hops": hops, "files": sorted(files)}


def linen_run():
    """One eager `apply` of the Linen layer (GQA 4/2, self-attention, batch 2, length 5, features 16)."""
    from attention import MultiHeadAttention

    layer = MultiHeadAttention(num_heads=4, num_kv_heads=2, qkv_features=16)
    x = jnp.ones((2, 5, 16))
    params = layer.init(jax.random.key(0), x)
    return lambda: layer.apply(params, x)


def nnx_run():
    """One eager call of the NNX layer (the same shapes)."""
    from flax import nnx

    from attention.nnx import MultiHeadAttention

    layer = MultiHeadAttention(num_heads=4, in_features=16, num_kv_heads=2, decode=False, rngs=nnx.Rngs(0))
    x = jnp.ones((2, 5, 16))
    return lambda: layer(x)


def main() -> None:
    for name, make, face in (("Linen", linen_run, "attention/layer.py"), ("NNX", nnx_run, "attention/nnx.py")):
        result = trace(make(), face)
        print(
            f"{name} ({face}): {result['calls_out']} calls out of the face, {result['hops']} hops between "
            f"{len(result['files'])} files"
        )
        for callee, n in sorted(result["by_callee"].items()):
            print(f"  {n} x {callee}")


if __name__ == "__main__":
    main()
