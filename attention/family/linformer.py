"""Linformer (Wang et al. 2020, "Linformer: Self-Attention with Linear Complexity"), eq. 7.

    head = softmax(Q (E K)ᵀ / √d_k) (F V),   E, F ∈ R^{k × n}

E and F project the n keys and values along the sequence to k rows, so the logits are n × k:
cost O(n k) time and memory instead of O(n²). n is a fixed `max_length`; a shorter input uses
the first Lk columns of E and F (the same as zero-padding it to `max_length`), and padded keys
are zeroed before the projection (they then add nothing to E K or F V). The projections mix
positions, so there is no causal Linformer: `is_causal` is a ValueError. E and F are shared
by all heads of the layer (the paper's "headwise sharing"); `share_kv` uses E for both.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from attention.core import attend
from attention.family.member import LayerFilled, key_padding, require_positive_ints

Array = Any


def _uniform_init(k):
    """U(-1/√k, 1/√k), as the reference implementations initialise E and F."""
    bound = k**-0.5
    return lambda key, shape, dtype=jnp.float32: nn.initializers.uniform(2 * bound)(key, shape, dtype) - bound


class Linformer(LayerFilled):
    """Low-rank attention: keys and values projected along the sequence to `projected_length` rows."""

    max_length: int = 256  # n: the longest key sequence (E and F have n columns)
    projected_length: int = 64  # k: rows of E K and F V
    share_kv: bool = False  # one projection E for keys and values (else E and F)
    impl: str = "vmap"

    @nn.compact
    def __call__(self, query, key, value, *, mask=None, is_causal=False, query_offset=0):
        """query `[B, Lq, H, d_k]`, key/value `[B, Lk, G, d]`; mask: key padding only. -> `[B, Lq, H, d_v]`."""
        require_positive_ints("linformer", max_length=self.max_length, projected_length=self.projected_length)
        if is_causal:
            raise ValueError(
                "attention_type='linformer' cannot be causal: E and F mix all positions; "
                "use it for encoder self-attention or cross-attention"
            )
        Lk = key.shape[1]
        if Lk > self.max_length:
            raise ValueError(
                f"linformer max_length = {self.max_length}; the keys have length {Lk} > max_length"
            )
        shape = (self.projected_length, self.max_length)
        e = self.param("E", _uniform_init(self.projected_length), shape, self.param_dtype)
        f = e if self.share_kv else self.param("F", _uniform_init(self.projected_length), shape, self.param_dtype)
        keep = key_padding("linformer", mask, Lk)
        if keep is not None:
            key, value = (jnp.where(keep[:, :, None, None], x, 0) for x in (key, value))
        project = lambda p, x: jnp.einsum("kn,bngd->bkgd", p[:, :Lk].astype(x.dtype), x, precision=self.precision)
        out, _ = attend(query, project(e, key), project(f, value), impl=self.impl, dtype=self.dtype,
                        precision=self.precision)
        return out
