"""Adaptive attention span (Sukhbaatar et al. 2019, "Adaptive Attention Span in Transformers"), eq. 3-4.

Each head h has a span z_h ∈ [0, S]; a key at distance x from the query is weighted by the soft
mask m_z(x) = min(max((R + z − x) / R, 0), 1) (ramp R) before normalisation:

    a_ij = m_z(i − j) exp(s_ij) / Σ_k m_z(i − k) exp(s_ik)

computed as softmax(s + log m) with m = 0 masked out, by `attention.attend` (any `impl`):
keys farther than S + R are never attended, so `impl="blockwise"` skips them (the window),
and the cost is O(N (S + R)) there; under beam search, by `attention.beams.history_attention`,
which reads the cache in place. Without `is_causal` the distance is |i − j|. The span is
the parameter "span" `[H]` as a fraction of S, clipped to [0, 1] in the forward pass (the paper
clamps it after each update), initialised to `span_init`. The paper's L1 penalty, (λ / M) Σ_h z_h
over a layer's M heads, is what lets spans shrink: with `l1_penalty` λ > 0 the module sows it
into the `losses` collection ("span_l1"), which the training step adds to its loss
(`training.core.step.train_step`); λ = 0 sows nothing.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention.beams import history_attention
from attention.geometry import require_positive_ints
from attention.core import attend
from attention.family.member import LayerFilled
from attention.core import kv_axes


def soft_mask(distance: jax.Array, span: jax.Array, ramp: float) -> jax.Array:
    """m_z(x) = clip((R + z − x) / R, 0, 1); distance and span broadcast against each other."""
    return jnp.clip((ramp + span - distance) / ramp, 0.0, 1.0)


class Span(LayerFilled):
    """Softmax attention under a learnable soft span per head."""

    max_span: int = 256  # S: the longest span a head can learn
    ramp: int = 32  # R: width of the soft mask's ramp
    span_init: float = 1.0  # initial span as a fraction of S (1: every head starts at S)
    l1_penalty: float = 0.0  # λ of the loss term (λ / H) Σ_h z_h, z in positions (the paper's L1 on spans)
    impl: str = "vmap"

    @nn.compact
    def __call__(
        self, query, key, value, *, mask=None, is_causal=False, query_offset=0, beam_rows=None, kv_layout="BTNH"
    ):
        """query `[B, Lq, H, d_k]`, key/value `[B, Lk, G, d]`, mask `[B|1, H|1, Lq|1, Lk|1]` -> `[B, Lq, H, d_v]`.

        kv_layout "BNTH": key/value `[B, G, Lk, d]`, as the decode cache holds them (`attention.attend`'s).
        beam_rows `[sources, K, Lk]`: under beam search, the cache read in place (`attention.beams`; "BNTH").
        """
        require_positive_ints("span ", max_span=self.max_span, ramp=self.ramp)
        if not 0.0 <= self.span_init <= 1.0:
            raise ValueError(f"span span_init = {self.span_init!r}; expected a fraction in [0, 1]")
        if not (isinstance(self.l1_penalty, (int, float)) and self.l1_penalty >= 0):
            raise ValueError(f"span l1_penalty = {self.l1_penalty!r}; expected a float >= 0")
        (_, Lq, H, _), Lk = query.shape, key.shape[kv_axes(kv_layout)[0]]
        fraction = self.param("span", nn.initializers.constant(self.span_init), (H,), self.param_dtype)
        z = self.max_span * jnp.clip(fraction.astype(jnp.float32), 0.0, 1.0).reshape(1, H, 1, 1)
        if self.l1_penalty > 0:
            self.sow("losses", "span_l1", self.l1_penalty * jnp.mean(z))
        # query_offset: an int or one per sequence, [B]; distance [B|1, 1, Lq, Lk]
        distance = jnp.reshape(query_offset, (-1, 1, 1)) + jnp.arange(Lq)[None, :, None] - jnp.arange(Lk)[None, None, :]
        distance = (distance if is_causal else jnp.abs(distance)).astype(jnp.float32)[:, None]
        m = soft_mask(distance, z, float(self.ramp))
        reach = self.max_span + self.ramp - 1  # m = 0 beyond it, whatever z
        window = (reach, 0 if is_causal else reach) if isinstance(query_offset, int) and query_offset == 0 else None
        inside = m > 0
        mask = inside if mask is None else jnp.logical_and(mask, inside)
        bias = jnp.log(jnp.maximum(m, jnp.finfo(jnp.float32).tiny))
        if beam_rows is not None:
            return history_attention(
                query,
                key,
                value,
                beam_rows,
                mask,
                dtype=self.dtype,
                precision=self.precision,
                bias=bias,
                formulation=self.formulation,
            )
        out, _ = attend(
            query,
            key,
            value,
            mask=mask,
            bias=bias,
            is_causal=is_causal and window is not None,
            local_window_size=window,
            impl=self.impl,
            dtype=self.dtype,
            precision=self.precision,
            formulation=self.formulation,
            kv_layout=kv_layout,
        )
        return out
