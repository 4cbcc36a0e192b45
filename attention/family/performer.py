"""Performer's FAVOR+ (Choromanski et al. 2021, "Rethinking Attention with Performers").

softmax(q·k / √d) is estimated by positive orthogonal random features (their Lemma 1):

    exp(x·y) = E_w[φ(x) φ(y)],  φ(x)_i = exp(w_iᵀx − |x|²/2) / √m,   x = q / d^¼,  y = k / d^¼

with the m rows w_i drawn in orthogonal blocks and rescaled to Gaussian norms. Attention is then
D⁻¹ φ(Q) (φ(K)ᵀ V) with D = diag(φ(Q) φ(K)ᵀ 1): cost O(N m d) time and O(N m + m d) memory.
Causal attention uses prefix sums of φ(k_j) v_jᵀ, computed chunk by chunk (a quadratic masked
product inside a chunk, a carried state between chunks), and decoding keeps only that state,
`[B, G, m, d_v]` plus two `[B, G, m]`, per layer: O(1) per token instead of a growing KV cache.

For float range, every feature is computed from its logit minus a shift M (one per feature, the
largest key logit seen so far, under `stop_gradient`): key features exp(wᵢᵀy − |y|²/2 − Mᵢ) ≤ 1,
query features exp(wᵢᵀx + Mᵢ − maxᵢ(wᵢᵀx + Mᵢ)) ≤ 1. Each product φ(q)ᵢφ(k)ᵢ is the paper's times a
per-query constant (the query's −|x|²/2 and 1/m among it), which the normalisation cancels, and the
key attaining Mᵢ for the query's largest feature puts at least 1 in its denominator: without the
shift a key far from every wᵢ underflowed the denominator towards 0, and its gradient (∝ 1/den²)
overflowed float32 (a NaN at step 146 of the Multi30k run). Causal passes and decoding carry M in
their state and rescale the sums when it grows (online, as flash attention does for softmax), so
a query's shift depends on no later key outside its chunk (inside it, keys e⁸⁰ weaker in every
feature than a later key of the chunk still underflow; the paper's code shifts by the whole
sequence's largest key). The features are a parameter
("random_features" `[m, d_k]`) under `stop_gradient`: drawn at init, never trained. Only
key-padding masks can be honoured (a padded key's logit is −∞).
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from attention.geometry import require_positive_ints
from attention.family.member import LayerFilled, grouped_queries, key_padding
from attention.masks import causal_from

_TINY = 1e-30  # below it a denominator counts as 0: that query (features all underflowed, or padding) outputs 0
_NO_KEY = -1e30  # the shift before any key: finite, so that rescaling by exp(old − new) never meets −∞ − (−∞)


def orthogonal_features(rng: jax.Array, num_features: int, dim: int, dtype: Any = jnp.float32) -> jax.Array:
    """`[m, d]`: blocks of d orthonormal rows (QR of a Gaussian), rows rescaled to chi(d) norms."""
    blocks = -(-num_features // dim)
    block_rng, norm_rng = jax.random.split(rng)
    q = jnp.linalg.qr(jax.random.normal(block_rng, (blocks, dim, dim), jnp.float32))[0]  # orthonormal columns
    w = jnp.swapaxes(q, 1, 2).reshape(blocks * dim, dim)[:num_features]
    norms = jnp.linalg.norm(jax.random.normal(norm_rng, (num_features, dim), jnp.float32), axis=-1)
    return (w * norms[:, None]).astype(dtype)


def feature_logits(query: jax.Array, key: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(wᵀx `[..., Lq, H, m]`, wᵀy − |y|²/2 `[..., Lk, G, m]`) in float32, x = q / d^¼, y = k / d^¼."""
    scale = query.shape[-1] ** -0.25
    x_q, x_k = (x.astype(jnp.float32) * scale for x in (query, key))
    proj = lambda x: jnp.einsum("...d,md->...m", x, w.astype(jnp.float32), precision=lax.Precision.HIGHEST)
    return proj(x_q), proj(x_k) - 0.5 * jnp.sum(x_k * x_k, axis=-1, keepdims=True)


def shifted_features(q_logit: jax.Array, k_logit: jax.Array, shift: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(φ(Q) `[B, Lq, G, R, m]`, φ(K) `[B, Lk, G, m]`) from their logits and the shift `[B, G, m]`."""
    q_exp = q_logit + shift[:, None, :, None]
    phi_q = jnp.exp(q_exp - lax.stop_gradient(q_exp.max(axis=-1, keepdims=True)))
    return phi_q, jnp.exp(k_logit - shift[:, None])


def grown_shift(shift: jax.Array, k_logit: jax.Array) -> jax.Array:
    """The shift `[B, G, m]` after the keys `k_logit` `[B, Lk, G, m]` (padded keys at −∞ add nothing)."""
    return lax.stop_gradient(jnp.maximum(shift, k_logit.max(axis=1)))


def bidirectional(q_logit: jax.Array, k_logit: jax.Array, value: jax.Array) -> jax.Array:
    """q_logit `[B, Lq, G, R, m]`, k_logit `[B, Lk, G, m]`, value `[B, Lk, G, d_v]` -> `[B, Lq, G, R, d_v]`."""
    B, _, G, m = k_logit.shape
    phi_q, phi_k = shifted_features(q_logit, k_logit, grown_shift(jnp.full((B, G, m), _NO_KEY), k_logit))
    kv = jnp.einsum("bkgm,bkgd->bgmd", phi_k, value)
    z = phi_k.sum(axis=1)
    num = jnp.einsum("bqgrm,bgmd->bqgrd", phi_q, kv)
    den = jnp.einsum("bqgrm,bgm->bqgr", phi_q, z)
    return _normalise(num, den)


def causal(
    q_logit: jax.Array, k_logit: jax.Array, value: jax.Array, state: tuple[jax.Array, jax.Array, jax.Array], chunk: int
):
    """Prefix-sum attention continuing `state` = (Σ φ(k)vᵀ `[B, G, m, d_v]`, Σ φ(k) `[B, G, m]`, shift `[B, G, m]`).

    Shapes as `bidirectional` with Lq == Lk = L. Returns (out `[B, L, G, R, d_v]`, final state). The
    shift grows once a chunk, over the chunk's keys; the sums so far are rescaled to it.
    """
    B, L, G, R, m = q_logit.shape
    C = min(chunk, L)
    pad = -L % C
    widths = lambda x: [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)
    # padded keys have logit −∞, so φ = 0 (they add nothing); padded queries are cut off below
    q_logit, value = (jnp.pad(x, widths(x)) for x in (q_logit, value))
    k_logit = jnp.pad(k_logit, widths(k_logit), constant_values=-jnp.inf)
    chunks = lambda x: jnp.moveaxis(x.reshape(B, (L + pad) // C, C, *x.shape[2:]), 1, 0)
    tril = causal_from(0, C, C).astype(jnp.float32)[None, None, None]  # [1, 1, 1, C, C]: in a chunk, key <= query

    def step(carry, xs):
        kv, z, shift = carry
        qc, kc, vc = xs
        new_shift = grown_shift(shift, kc)
        rescale = jnp.exp(shift - new_shift)
        kv, z = kv * rescale[..., None], z * rescale
        qc, kc = shifted_features(qc, kc, new_shift)
        a = jnp.einsum("bqgrm,bkgm->bgrqk", qc, kc) * tril
        num = jnp.einsum("bgrqk,bkgd->bqgrd", a, vc) + jnp.einsum("bqgrm,bgmd->bqgrd", qc, kv)
        den = jnp.einsum("bgrqk->bqgr", a) + jnp.einsum("bqgrm,bgm->bqgr", qc, z)
        carry = (kv + jnp.einsum("bkgm,bkgd->bgmd", kc, vc), z + kc.sum(axis=1), new_shift)
        return carry, _normalise(num, den)

    state, out = lax.scan(step, state, (chunks(q_logit), chunks(k_logit), chunks(value)))
    out = jnp.moveaxis(out, 0, 1).reshape(B, L + pad, G, R, -1)[:, :L]
    return out, state


class Performer(LayerFilled):
    """FAVOR+ attention with `num_features` positive orthogonal random features; causal by prefix sums."""

    num_features: int | None = None  # m (None: round(d_k ln d_k), the paper's choice)
    chunk_length: int = 128  # causal: keys per chunk of the prefix-sum scan
    decode: bool = False

    @nn.compact
    def __call__(self, query, key, value, *, mask=None, is_causal=False, query_offset=0):
        """query `[B, Lq, H, d_k]`, key/value `[B, Lk, G, d]`; mask: key padding only. -> `[B, Lq, H, d_v]`."""
        d_k, G, d_v = query.shape[-1], key.shape[-2], value.shape[-1]
        m = self.num_features or max(1, round(d_k * math.log(d_k)))
        require_positive_ints("performer ", num_features=m, chunk_length=self.chunk_length)
        w = self.param(
            "random_features",
            lambda rng, shape, dtype: orthogonal_features(rng, *shape, dtype),
            (m, d_k),
            self.param_dtype,
        )
        q_logit, k_logit = feature_logits(query, key, lax.stop_gradient(w))
        keep = key_padding("performer", mask, key.shape[1])
        if keep is not None:
            k_logit = jnp.where(keep[:, :, None, None], k_logit, -jnp.inf)
        q_logit = grouped_queries(q_logit, G)
        value32 = value.astype(jnp.float32)
        B = query.shape[0]
        if self.decode:
            out = self._decode(q_logit, k_logit, value32, (B, G, m, d_v))
        elif is_causal:
            if query.shape[1] != key.shape[1]:
                raise ValueError(f"causal performer needs Lq == Lk, got {query.shape[1]} and {key.shape[1]}")
            out, _ = causal(q_logit, k_logit, value32, _empty_state(B, G, m, d_v), self.chunk_length)
        else:
            out = bidirectional(q_logit, k_logit, value32)
        dtype = self.dtype or jnp.result_type(query, value)
        return out.reshape(*query.shape[:-1], d_v).astype(dtype)

    def _decode(self, q_logit, k_logit, value, shape):
        """Causal attention that continues from the cached state and stores the new one (not at init)."""
        is_initialized = self.has_variable("cache", "state_kv")
        state = [self.variable("cache", name, lambda: empty) for name, empty in zip(_STATE, _empty_state(*shape))]
        if not is_initialized:  # init: size the state, attend over the inputs as a causal pass
            return causal(q_logit, k_logit, value, _empty_state(*shape), self.chunk_length)[0]
        if q_logit.shape[1] != k_logit.shape[1]:
            raise ValueError("performer decode feeds as many keys as queries (self-attention)")
        out, new_state = causal(q_logit, k_logit, value, tuple(v.value for v in state), self.chunk_length)
        for variable, new in zip(state, new_state):
            variable.value = new
        return out


_STATE = ("state_kv", "state_z", "state_shift")


@jax.custom_jvp
def _normalise(num, den):
    """num `[..., d_v]` / den `[...]`, and 0 where den underflowed.

    A `where`, not a floor: a floored den's gradient is 0/0.
    """
    ok = den > _TINY
    return num / jnp.where(ok, den, 1.0)[..., None] * ok[..., None]


@_normalise.defjvp
def _normalise_jvp(primals, tangents):
    """d(n/d) = (dn − (n/d)·dd) / d: never 1/d², which overflows float32 once d < 1e-19 (JAX's own rule)."""
    (num, den), (d_num, d_den) = primals, tangents
    out = _normalise(num, den)
    return out, _normalise(d_num - out * d_den[..., None], den)


def _empty_state(B, G, m, d_v):
    """No key yet: zero sums `[B, G, m, d_v]`, `[B, G, m]` and the lowest shift `[B, G, m]`."""
    return (
        jnp.zeros((B, G, m, d_v), jnp.float32),
        jnp.zeros((B, G, m), jnp.float32),
        jnp.full((B, G, m), _NO_KEY, jnp.float32),
    )
