"""How attention spells the few steps whose fastest form depends on the compiler: a strategy, plain by default.

`Formulation` is the plain formulation, the one Flax writes: q kᵀ and weights · v as einsums,
a decode cache write that XLA may fuse as it likes, a decode step's log_softmax left to XLA to fuse
with the vocabulary matmul (`decode_log_probs`, which `models.decoding` calls). It is what runs on
GPU and TPU, and what every attention function and layer uses unless given another. A backend
whose compiler runs another spelling of the same numbers faster subclasses it (XLA:CPU:
`backends.xla_cpu.XlaCpuFormulation`) and the caller passes that in (`attend(..., formulation=)`,
the layers' `formulation`, `models.TransformerConfig.formulation`), so attention/ imports no
backend code and the plain path carries none of a CPU's workarounds. `products` binds a
formulation's two products for `attention.head.attention_head`, which takes them as functions
and knows no formulation.

A formulation also names the JAX platform it was chosen for (`platform`), so choices that depend
on the platform (`impl="auto"` taking cuDNN) are made for the program's target, decided where the
formulation was chosen, not read from the process's default backend while tracing: lowering for
CUDA on a CPU machine (`jax.export(..., platforms=("cuda",))`) with a formulation for "cuda" traces
the GPU's choices. `platform=None` (as `PLAIN`) leaves it to the default backend at trace time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


def logits_dtype(dtype):
    """The dtype of logits and softmax: float32, or wider if the inputs are."""
    return jnp.promote_types(dtype, jnp.float32)


class Formulation:
    """The plain formulation; subclass and override a method to respell it for a backend.

    Each method computes the same numbers (up to the order of float sums) in every subclass.
    Instances hold nothing but their platform and compare equal by class and platform, so they can sit
    in a (hashed) config.

    platform: the JAX platform ("cpu", "cuda", "rocm", "tpu"; "gpu" as `jax.default_backend()` names
    CUDA and ROCm) the program is for; None: the process's default backend where it is traced.
    """

    _platform: str | None = None

    def __init__(self, platform: str | None = None):
        if platform is not None and not (isinstance(platform, str) and platform):
            raise ValueError(f"platform = {platform!r}; expected None or a JAX platform name such as 'cpu' or 'cuda'")
        self._platform = None if platform is None else platform.lower()

    @property
    def platform(self) -> str | None:
        """The JAX platform this formulation was chosen for (read-only: it is part of the hash)."""
        return self._platform

    def __eq__(self, other):
        return type(other) is type(self) and other.platform == self.platform

    def __hash__(self):
        return hash((type(self), self.platform))

    def scores(self, q: jax.Array, k: jax.Array, *, precision: Any) -> jax.Array:
        """One head's logits: q `[Lq, d_k]` (already scaled), k `[Lk, d_k]` -> q kᵀ `[Lq, Lk]` in `logits_dtype`."""
        return jnp.einsum("qd,kd->qk", q, k, precision=precision, preferred_element_type=logits_dtype(q.dtype))

    def mix(self, weights: jax.Array, v: jax.Array, *, precision: Any) -> jax.Array:
        """One head's output: weights `[Lq, Lk]`, v `[Lk, d_v]` -> `[Lq, d_v]` in `logits_dtype(v.dtype)`."""
        return jnp.einsum("qk,kd->qd", weights, v, precision=precision, preferred_element_type=logits_dtype(v.dtype))

    def write_cache(self, cache: Any, key: jax.Array, value: jax.Array) -> Any:
        """A decode step's write: `cache` (an `attention.cache.KVCache`) with key `[batch..., L_new, G, d_k]` and
        value `[batch..., L_new, G, d_v]` written at its index (`KVCache.write`), as XLA fuses it."""
        return cache.write(key, value)

    def broadcast_queries(self, queries: jax.Array, shape: tuple[int, ...]) -> jax.Array:
        """Beam search's query block broadcast over a source's rows (`attention.beams.history_attention`)."""
        return jnp.broadcast_to(queries, shape)

    def materialize(self, tree: Any) -> Any:
        """The hook a backend overrides to have arrays computed once and read by every consumer: as they are here.

        The plain steps above do not call it; a backend's override of a step may (XLA:CPU keeps the written
        cache and beam search's query block materialised behind a barrier, `backends.xla_cpu`).
        """
        return tree

    def decode_log_probs(self, logits: jax.Array) -> jax.Array:
        """A decode step's log-probabilities: logits `[N, vocab]` -> log_softmax over the vocabulary, `[N, vocab]`.

        Plain: XLA may fuse log_softmax into the vocabulary matmul as it likes (`models.decoding`).
        """
        return jax.nn.log_softmax(logits)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({'' if self.platform is None else repr(self.platform)})"


PLAIN = Formulation()


def target(platform: str | None) -> str:
    """The platform a program is for: `platform` (lower-cased), or the process's default backend where it is None."""
    return (platform or jax.default_backend()).lower()


def is_nvidia_gpu(platform: str | None) -> bool:
    """Whether `target(platform)` is where cuDNN runs: "cuda", or "gpu" as `jax.default_backend()` names a GPU."""
    return target(platform) in ("cuda", "gpu")


def products(formulation: Formulation | None, precision: Any = None) -> tuple[Callable, Callable]:
    """One head's two products as `attention.head.attention_head` takes them: (scores(q, k), mix(weights, v)),
    `formulation`'s (`resolve`d) with `precision` bound."""
    formulation = resolve(formulation)
    return (
        functools.partial(formulation.scores, precision=precision),
        functools.partial(formulation.mix, precision=precision),
    )


def resolve(formulation: Formulation | None) -> Formulation:
    """`formulation`, or `PLAIN` for None; a ValueError for anything else."""
    if formulation is None:
        return PLAIN
    if not isinstance(formulation, Formulation):
        raise ValueError(f"formulation = {formulation!r}; expected None or an attention.Formulation")
    return formulation
