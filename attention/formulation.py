"""How attention spells the few steps whose fastest form depends on the compiler: a strategy, plain by default.

`Formulation` is the plain formulation, the one Flax writes: q kᵀ and weights · v as einsums,
a decode cache write that XLA may fuse as it likes. It is what runs on GPU and TPU, and what every
attention function and layer uses unless given another. A backend whose compiler runs another
spelling of the same numbers faster subclasses it (XLA:CPU: `backends.xla_cpu.XlaCpuFormulation`)
and the caller passes that in (`attend(..., formulation=)`, the layers' `formulation`,
`models.TransformerConfig.formulation`), so attention/ imports no backend code and the plain
path carries none of a CPU's workarounds.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

Array = Any


def logits_dtype(dtype):
    """The dtype of logits and softmax: float32, or wider if the inputs are."""
    return jnp.promote_types(dtype, jnp.float32)


class Formulation:
    """The plain formulation; subclass and override a method to respell it for a backend.

    Each method computes the same numbers (up to the order of float sums) in every subclass.
    Instances are stateless and compared by identity, so they can sit in a (hashed) config.
    """

    def scores(self, q: Array, k: Array, *, precision: Any, heads_sharing_kv: int) -> Array:
        """One head's logits: q `[Lq, d_k]` (already scaled), k `[Lk, d_k]` -> q kᵀ `[Lq, Lk]` in `logits_dtype`.

        `heads_sharing_kv`: how many query heads a `vmap` maps over this k (GQA's H/G).
        """
        del heads_sharing_kv
        return jnp.einsum("qd,kd->qk", q, k, precision=precision, preferred_element_type=logits_dtype(q.dtype))

    def mix(self, weights: Array, v: Array, *, precision: Any, heads_sharing_kv: int) -> Array:
        """One head's output: weights `[Lq, Lk]`, v `[Lk, d_v]` -> `[Lq, d_v]` in `logits_dtype(v.dtype)`."""
        del heads_sharing_kv
        return jnp.einsum("qk,kd->qd", weights, v, precision=precision, preferred_element_type=logits_dtype(v.dtype))

    def materialize(self, tree: Any) -> Any:
        """Arrays the caller wants computed once and read by every consumer (a cache update): as they are."""
        return tree

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


PLAIN = Formulation()


def resolve(formulation: Formulation | None) -> Formulation:
    """`formulation`, or `PLAIN` for None; a ValueError for anything else."""
    if formulation is None:
        return PLAIN
    if not isinstance(formulation, Formulation):
        raise ValueError(f"formulation = {formulation!r}; expected None or an attention.Formulation")
    return formulation
