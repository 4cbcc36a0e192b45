"""Performer's FAVOR+ (Choromanski et al. 2021, "Rethinking Attention with Performers").

softmax(q·k / √d) is estimated by positive orthogonal random features (their Lemma 1):

    exp(x·y) = E_w[φ(x) φ(y)],  φ(x)_i = exp(w_iᵀx − |x|²/2) / √m,   x = q / d^¼,  y = k / d^¼

with the m rows w_i drawn in orthogonal blocks and rescaled to Gaussian norms. Attention is then
D⁻¹ φ(Q) (φ(K)ᵀ V) with D = diag(φ(Q) φ(K)ᵀ 1): cost O(N m d) time and O(N m + m d) memory.
Causal attention uses prefix sums of φ(k_j) v_jᵀ, computed chunk by chunk (a quadratic masked
product inside a chunk, a carried state between chunks), and decoding keeps only that state,
`[B, G, m, d_v]` plus `[B, G, m]`, per layer: O(1) per token instead of a growing KV cache.

For float range, key features use exp(−|x − w_i|²/2) ≤ 1 and query features exp(w_iᵀx − |x|²/2
+ |w_i|²/2) minus each query's max exponent: the product is the paper's, times a per-query
constant that the normalisation cancels, and nothing depends on future keys. The features are a
parameter ("random_features" `[m, d_k]`) under `stop_gradient`: drawn at init, never trained.
Only key-padding masks can be honoured (φ(k_j) is zeroed).
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from attention.family.member import LayerFilled, grouped_queries, key_padding, require_positive_ints

Array = Any
_TINY = 1e-30  # below it a denominator counts as 0: that query (features all underflowed, or padding) outputs 0


def orthogonal_features(rng: Array, num_features: int, dim: int, dtype: Any = jnp.float32) -> Array:
    """`[m, d]`: blocks of d orthonormal rows (QR of a Gaussian), rows rescaled to chi(d) norms."""
    blocks = -(-num_features // dim)
    block_rng, norm_rng = jax.random.split(rng)
    q = jnp.linalg.qr(jax.random.normal(block_rng, (blocks, dim, dim), jnp.float32))[0]  # orthonormal columns
    w = jnp.swapaxes(q, 1, 2).reshape(blocks * dim, dim)[:num_features]
    norms = jnp.linalg.norm(jax.random.normal(norm_rng, (num_features, dim), jnp.float32), axis=-1)
    return (w * norms[:, None]).astype(dtype)


def feature_maps(query: Array, key: Array, w: Array) -> tuple[Array, Array]:
    """(φ(Q) `[..., Lq, H, m]`, φ(K) `[..., Lk, G, m]`) in float32, stabilised as the module docstring says."""
    d, m = query.shape[-1], w.shape[0]
    scale = d**-0.25
    x_q, x_k = (x.astype(jnp.float32) * scale for x in (query, key))
    w = w.astype(jnp.float32)
    half_w2 = 0.5 * jnp.sum(w * w, axis=-1)
    proj = lambda x: jnp.einsum("...d,md->...m", x, w, precision=lax.Precision.HIGHEST)
    half_x2 = lambda x: 0.5 * jnp.sum(x * x, axis=-1, keepdims=True)
    half_w2 = half_w2.reshape((1,) * (x_q.ndim - 1) + (m,))
    q_exp = proj(x_q) - half_x2(x_q) + half_w2
    q_exp = q_exp - lax.stop_gradient(q_exp.max(axis=-1, keepdims=True))
    k_exp = proj(x_k) - half_x2(x_k) - half_w2.reshape((1,) * (x_k.ndim - 1) + (m,))
    norm = 1.0 / math.sqrt(m)
    return jnp.exp(q_exp) * norm, jnp.exp(k_exp) * norm


def bidirectional(phi_q: Array, phi_k: Array, value: Array) -> Array:
    """phi_q `[B, Lq, G, R, m]`, phi_k `[B, Lk, G, m]`, value `[B, Lk, G, d_v]` -> `[B, Lq, G, R, d_v]`."""
    kv = jnp.einsum("bkgm,bkgd->bgmd", phi_k, value)
    z = phi_k.sum(axis=1)
    num = jnp.einsum("bqgrm,bgmd->bqgrd", phi_q, kv)
    den = jnp.einsum("bqgrm,bgm->bqgr", phi_q, z)
    return _normalise(num, den)


def causal(phi_q: Array, phi_k: Array, value: Array, state: tuple[Array, Array], chunk: int):
    """Prefix-sum attention from `state` = (Σ φ(k)vᵀ `[B, G, m, d_v]`, Σ φ(k) `[B, G, m]`) of earlier keys.

    Shapes as `bidirectional` with Lq == Lk = L. Returns (out `[B, L, G, R, d_v]`, final state).
    """
    B, L, G, R, m = phi_q.shape
    C = min(chunk, L)
    pad = -L % C
    widths = lambda x: [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)
    # padded keys have φ = 0 (they add nothing); padded queries are cut off below
    phi_q, phi_k, value = (jnp.pad(x, widths(x)) for x in (phi_q, phi_k, value))
    chunks = lambda x: jnp.moveaxis(x.reshape(B, (L + pad) // C, C, *x.shape[2:]), 1, 0)
    tril = jnp.tril(jnp.ones((1, 1, 1, C, C), jnp.float32))

    def step(carry, xs):
        kv, z = carry
        qc, kc, vc = xs
        a = jnp.einsum("bqgrm,bkgm->bgrqk", qc, kc) * tril
        num = jnp.einsum("bgrqk,bkgd->bqgrd", a, vc) + jnp.einsum("bqgrm,bgmd->bqgrd", qc, kv)
        den = jnp.einsum("bgrqk->bqgr", a) + jnp.einsum("bqgrm,bgm->bqgr", qc, z)
        carry = (kv + jnp.einsum("bkgm,bkgd->bgmd", kc, vc), z + kc.sum(axis=1))
        return carry, _normalise(num, den)

    state, out = lax.scan(step, state, (chunks(phi_q), chunks(phi_k), chunks(value)))
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
        require_positive_ints("performer", num_features=m, chunk_length=self.chunk_length)
        w = self.param("random_features", lambda rng, shape, dtype: orthogonal_features(rng, *shape, dtype),
                       (m, d_k), self.param_dtype)
        phi_q, phi_k = feature_maps(query, key, lax.stop_gradient(w))
        keep = key_padding("performer", mask, key.shape[1])
        if keep is not None:
            phi_k = jnp.where(keep[:, :, None, None], phi_k, 0.0)
        phi_q = grouped_queries(phi_q, G)
        value32 = value.astype(jnp.float32)
        B = query.shape[0]
        if self.decode:
            out = self._decode(phi_q, phi_k, value32, (B, G, m, d_v))
        elif is_causal:
            if query.shape[1] != key.shape[1]:
                raise ValueError(f"causal performer needs Lq == Lk, got {query.shape[1]} and {key.shape[1]}")
            out, _ = causal(phi_q, phi_k, value32, _zero_state(B, G, m, d_v), self.chunk_length)
        else:
            out = bidirectional(phi_q, phi_k, value32)
        dtype = self.dtype or jnp.result_type(query, value)
        return out.reshape(*query.shape[:-1], d_v).astype(dtype)

    def _decode(self, phi_q, phi_k, value, shape):
        """Causal attention that continues from the cached state and stores the new one (not at init)."""
        B, G, m, d_v = shape
        is_initialized = self.has_variable("cache", "state_kv")
        kv = self.variable("cache", "state_kv", jnp.zeros, (B, G, m, d_v), jnp.float32)
        z = self.variable("cache", "state_z", jnp.zeros, (B, G, m), jnp.float32)
        if not is_initialized:  # init: size the state, attend over the inputs as a causal pass
            return causal(phi_q, phi_k, value, _zero_state(B, G, m, d_v), self.chunk_length)[0]
        if phi_q.shape[1] != phi_k.shape[1]:
            raise ValueError("performer decode feeds as many keys as queries (self-attention)")
        out, (kv.value, z.value) = causal(phi_q, phi_k, value, (kv.value, z.value), self.chunk_length)
        return out


def _normalise(num, den):
    """num / den, and 0 where den underflowed (a `where`, not a floor: a floored den's gradient is 0/0)."""
    ok = den > _TINY
    return num / jnp.where(ok, den, 1.0)[..., None] * ok[..., None]


def _zero_state(B, G, m, d_v):
    return jnp.zeros((B, G, m, d_v), jnp.float32), jnp.zeros((B, G, m), jnp.float32)
