"""Adaptively sparse attention (Correia, Niculae and Martins 2019): α-entmax weights, α learned per head.

    α-entmax(z)_j = [(α − 1) z_j − τ]_+^{1/(α−1)},   τ such that Σ_j = 1   (Peters et al. 2019)

α = 1 is softmax (the limit), α = 2 sparsemax; in between, weights are exactly zero off a
data-dependent support. τ is found by bisection (`iterations` halvings of an interval of width
≤ 1, so float32's resolution); the backward pass is the closed form of the entmax Jacobian and
of ∂/∂α (Correia et al., Prop. 1 and §3.2), not a differentiation through the bisection. Each
head's α = 1 + sigmoid(a) ∈ (1, 2), `a` the parameter "alpha_logit" `[H]` (the paper's
parametrisation), so α starts at 1.5 by default. Cost: O(N²) as softmax, times the bisection's
elementwise passes.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention.family.member import LayerFilled, grouped_queries
from attention.core import kv_axes
from attention.masks import causal_from

_ALPHA_MIN = 1.0 + 1e-3  # α is clipped here: at α = 1 the closed form divides by α − 1


def entmax(logits: jax.Array, alpha: jax.Array, iterations: int = 30) -> jax.Array:
    """α-entmax over the last axis; `alpha` broadcastable to `logits.shape[:-1] + (1,)`, same rank.

    `-inf` logits get weight 0; a row of only `-inf` must not occur (the caller makes it uniform).
    """
    logits = logits.astype(jnp.float32)
    alpha = jnp.broadcast_to(jnp.maximum(alpha.astype(jnp.float32), _ALPHA_MIN), (*logits.shape[:-1], 1))
    return _entmax(iterations, logits, alpha)


def _probabilities(x, tau, alpha):
    # [x − τ]_+^{1/(α−1)} as exp(log(·) / (α − 1)), log 0 = −inf giving 0: XLA's CPU `pow` with a learned
    # (traced) exponent cost ~7× this pair, and the bisection takes it 31 times (bench.attention_family:
    # entmax's forward+backward went from 3.4-5.4× to 1.9-2.6× dense XLA attention's time)
    return jnp.exp(jnp.log(jnp.maximum(x - tau, 0.0)) / (alpha - 1.0))


def _forward(iterations, z, alpha):
    x = z * (alpha - 1.0)
    top = x.max(axis=-1, keepdims=True)
    n = z.shape[-1]
    lo = top - 1.0  # p(τ = max − 1) >= 1 at the top entry alone
    hi = top - (1.0 / n) ** (alpha - 1.0)  # Σ p(τ) <= 1 there

    def halve(_, bounds):
        lo, hi = bounds
        mid = 0.5 * (lo + hi)
        too_much = _probabilities(x, mid, alpha).sum(axis=-1, keepdims=True) >= 1.0
        return jnp.where(too_much, mid, lo), jnp.where(too_much, hi, mid)

    lo, hi = jax.lax.fori_loop(0, iterations, halve, (lo, hi))
    p = _probabilities(x, 0.5 * (lo + hi), alpha)
    return p / p.sum(axis=-1, keepdims=True)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _entmax(iterations, z, alpha):
    return _forward(iterations, z, alpha)


def _entmax_fwd(iterations, z, alpha):
    p = _forward(iterations, z, alpha)
    return p, (p, alpha)


def _entmax_bwd(iterations, residuals, dp):
    p, alpha = residuals
    log_p = jnp.log(jnp.where(p > 0, p, 1.0))  # 0 off the support, where every term below is 0
    s = jnp.where(p > 0, jnp.exp((2.0 - alpha) * log_p), 0.0)  # p^{2−α}; ∂p/∂z = diag(s) − s sᵀ / Σs
    s_sum = s.sum(axis=-1, keepdims=True)
    dz = s * dp
    dz = dz - s * dz.sum(axis=-1, keepdims=True) / s_sum
    # ∂p/∂α (Correia et al. §3.2): with q = s / Σs and H the Shannon term p log p
    q = s / s_sum
    p_log_p = p * log_p
    entropy = p_log_p.sum(axis=-1, keepdims=True)
    dp_dalpha = (p - q) / (alpha - 1.0) ** 2 - (p_log_p - q * entropy) / (alpha - 1.0)
    d_alpha = (dp * dp_dalpha).sum(axis=-1, keepdims=True)
    return dz, d_alpha


_entmax.defvjp(_entmax_fwd, _entmax_bwd)


class Entmax(LayerFilled):
    """Attention whose weights are α-entmax of the scaled logits, α = 1 + sigmoid(alpha_logit) per head."""

    alpha_init: float = 1.5  # every head's initial α, in (1, 2)
    iterations: int = 30  # bisection steps for τ

    @nn.compact
    def __call__(self, query, key, value, *, mask=None, is_causal=False, query_offset=0, kv_layout="BTNH"):
        """query `[B, Lq, H, d_k]`, key/value `[B, Lk, G, d]`, mask `[B|1, H|1, Lq|1, Lk|1]` -> `[B, Lq, H, d_v]`.

        kv_layout "BNTH": key/value `[B, G, Lk, d]`, as the decode cache holds them (`attention.attend`'s).
        """
        if not 1.0 < self.alpha_init < 2.0:
            raise ValueError(f"entmax alpha_init = {self.alpha_init!r}; expected a float in (1, 2)")
        (B, Lq, H, d_k), (Lk, G) = query.shape, (key.shape[axis] for axis in kv_axes(kv_layout))
        kv = "bkgd" if kv_layout == "BTNH" else "bgkd"  # key/value's axes
        logit = math.log((self.alpha_init - 1.0) / (2.0 - self.alpha_init))
        a = self.param("alpha_logit", nn.initializers.constant(logit), (H,), self.param_dtype)
        alpha = (1.0 + jax.nn.sigmoid(a.astype(jnp.float32))).reshape(1, G, H // G, 1, 1)
        q = grouped_queries(query, G) * jnp.asarray(1 / math.sqrt(d_k), query.dtype)
        z = jnp.einsum(f"bqgrd,{kv}->bgrqk", q, key, precision=self.precision, preferred_element_type=jnp.float32)
        allowed = _allowed(mask, is_causal, query_offset, G, Lq, Lk)
        if allowed is not None:
            z = jnp.where(allowed, z, -jnp.inf)
            z = jnp.where(allowed.any(axis=-1, keepdims=True), z, 0.0)  # no key left: uniform (mean of V)
        p = entmax(z, alpha, self.iterations)
        out = jnp.einsum(
            f"bgrqk,{kv}->bqgrd",
            p.astype(value.dtype),
            value,
            precision=self.precision,
            preferred_element_type=jnp.float32,
        )
        dtype = self.dtype or jnp.result_type(query, value)
        return out.reshape(B, Lq, H, -1).astype(dtype)


def _allowed(mask, is_causal, query_offset, G, Lq, Lk):
    """The mask `[B|1, H|1, Lq|1, Lk|1]` and causal structure as `[B|1, G|1, R|1, Lq, Lk]` bool, or None."""
    parts = []
    if mask is not None:
        Bm, Hm = mask.shape[:2]
        groups = (G, Hm // G) if Hm != 1 else (1, 1)
        parts.append(mask.reshape(Bm, *groups, *mask.shape[2:]))
    if is_causal:  # query_offset: an int or one per sequence, [B]
        parts.append(causal_from(jnp.reshape(query_offset, (-1,)), Lq, Lk)[:, None, None])
    if not parts:
        return None
    allowed = parts[0] if len(parts) == 1 else parts[0] & parts[1]
    return jnp.broadcast_to(allowed, (*allowed.shape[:3], Lq, Lk))
