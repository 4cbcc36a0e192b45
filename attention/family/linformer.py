"""Linformer (Wang et al. 2020, "Linformer: Self-Attention with Linear Complexity"), eq. 7.

    head = softmax(Q (E K)ᵀ / √d_k) (F V),   E, F ∈ R^{k × n}

E and F project the n keys and values along the sequence to k rows, so the logits are n × k:
cost O(n k) time and memory instead of O(n²). n is a fixed `max_length`; a shorter input uses
the first Lk columns of E and F (the same as zero-padding it to `max_length`), and padded keys
are zeroed before the projection (they then add nothing to E K or F V). The projections mix
positions, so there is no causal Linformer: `is_causal` is a ValueError. E and F are shared
by all heads of the layer (the paper's "headwise sharing"); `share_kv` uses E for both.
`projection_init` "uniform" starts E and F as the reference implementations do (noise over all n
positions); "pooling" starts them as mean pooling over consecutive windows of n / k positions (the
paper's §4 alternative to a learned projection, here only the starting point), which at k = n is
the identity: Linformer then starts as exact attention.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from attention.geometry import require_positive_ints
from attention.core import attend
from attention.family.member import LayerFilled, key_padding


def _uniform_init(k):
    """U(-1/√k, 1/√k), as the reference implementations initialise E and F."""
    bound = k**-0.5
    return lambda key, shape, dtype=jnp.float32: nn.initializers.uniform(2 * bound)(key, shape, dtype) - bound


def _pooling_init(key, shape, dtype=jnp.float32):
    """Row i averages the positions j with ⌊j k / n⌋ = i: consecutive windows of n / k (the identity at k = n)."""
    k, n = shape
    window = jnp.arange(n) * k // n
    rows = (jnp.arange(k)[:, None] == window[None, :]).astype(jnp.float32)
    return (rows / jnp.maximum(rows.sum(axis=1, keepdims=True), 1.0)).astype(dtype)


_PROJECTION_INITS = {"uniform": _uniform_init, "pooling": lambda k: _pooling_init}


class Linformer(LayerFilled):
    """Low-rank attention: keys and values projected along the sequence to `projected_length` rows."""

    max_length: int = 256  # n: the longest key sequence (E and F have n columns)
    projected_length: int = 64  # k: rows of E K and F V
    share_kv: bool = False  # one projection E for keys and values (else E and F)
    projection_init: str = "uniform"  # E and F's start: "uniform" (noise) or "pooling" (window means)
    impl: str = "vmap"

    @nn.compact
    def __call__(self, query, key, value, *, mask=None, is_causal=False, query_offset=0):
        """query `[B, Lq, H, d_k]`, key/value `[B, Lk, G, d]`; mask: key padding only. -> `[B, Lq, H, d_v]`."""
        require_positive_ints("linformer ", max_length=self.max_length, projected_length=self.projected_length)
        if is_causal:
            raise ValueError(
                "attention_type='linformer' cannot be causal: E and F mix all positions; "
                "use it for encoder self-attention or cross-attention"
            )
        if self.projection_init not in _PROJECTION_INITS:
            raise ValueError(
                f"linformer projection_init = {self.projection_init!r}; expected one of {sorted(_PROJECTION_INITS)}"
            )
        Lk = key.shape[1]
        if Lk > self.max_length:
            raise ValueError(f"linformer max_length = {self.max_length}; the keys have length {Lk} > max_length")
        shape = (self.projected_length, self.max_length)
        init = _PROJECTION_INITS[self.projection_init](self.projected_length)
        e = self.param("E", init, shape, self.param_dtype)
        f = e if self.share_kv else self.param("F", init, shape, self.param_dtype)
        keep = key_padding("linformer", mask, Lk)
        if keep is not None:
            key, value = (jnp.where(keep[:, :, None, None], x, 0) for x in (key, value))
        project = lambda p, x: jnp.einsum("kn,bngd->bkgd", p[:, :Lk].astype(x.dtype), x, precision=self.precision)
        out, _ = attend(
            query,
            project(e, key),
            project(f, value),
            impl=self.impl,
            dtype=self.dtype,
            precision=self.precision,
            formulation=self.formulation,
        )
        return out
