"""Reformer's LSH attention (Kitaev, Kaiser and Levskaya 2020, "Reformer: The Efficient Transformer"), §2.

Queries and keys are shared (k_j = q_j / |q_j|). Each of `num_hashes` rounds hashes the vectors
by a random rotation R (angular LSH: h(x) = argmax([xR; −xR]), `num_buckets` buckets), sorts the
positions by (bucket, position), cuts the sorted sequence into chunks of `chunk_length` and lets
each query attend the keys of its bucket in its own chunk and the one before; a query attends
itself only when nothing else is left (its logit set to −1e5, the paper's convention, unless
`mask_self=False`). The rounds are combined by their log-sum-exps (eq. 4 over the union of
rounds). Cost O(num_hashes N c) time and memory. The rotation is a parameter ("rotations"
`[d_k, num_hashes, num_buckets / 2]`) under `stop_gradient`, drawn at init. Only key-padding
masks can be honoured; causal masking compares the original positions.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from attention.geometry import require_positive_ints
from attention.family.member import LayerFilled, key_padding
from attention.masks import allowed_by_position

_SELF = -1e5  # Reformer's logit for a query's own key
_MASKED = -1e9


def hash_buckets(x: jax.Array, rotations: jax.Array) -> jax.Array:
    """x `[B, H, L, d]`, rotations `[d, n_hashes, n_buckets / 2]` -> buckets `[B, H, n_hashes, L]` int32."""
    rotated = jnp.einsum("bhld,dnk->bhnlk", x, rotations)
    return jnp.argmax(jnp.concatenate([rotated, -rotated], axis=-1), axis=-1).astype(jnp.int32)


class LSH(LayerFilled):
    """Shared-QK attention within LSH buckets, sorted and chunked, over `num_hashes` rounds."""

    num_buckets: int = 8  # buckets per round (even; 1: one bucket, exact shared-QK attention per chunk pair)
    chunk_length: int = 64  # c: queries per chunk
    num_hashes: int = 2  # rounds of hashing
    mask_self: bool = True  # a query attends itself only if no other key is left

    @nn.compact
    def __call__(self, query, key, value, *, mask=None, is_causal=False, query_offset=0):
        """query `[B, L, H, d_k]` (the keys are the queries), value `[B, L, H, d_v]` -> `[B, L, H, d_v]`."""
        require_positive_ints(
            "lsh ", num_buckets=self.num_buckets, chunk_length=self.chunk_length, num_hashes=self.num_hashes
        )
        if self.num_buckets > 1 and self.num_buckets % 2:
            raise ValueError(f"lsh num_buckets = {self.num_buckets}; expected 1 or an even int (x R and -x R)")
        B, L, H, d = query.shape
        keep = key_padding("lsh", mask, L)
        keep = jnp.ones((B, L), bool) if keep is None else jnp.broadcast_to(keep, (B, L))
        C = min(self.chunk_length, L)
        pad = -L % C
        q = jnp.pad(jnp.swapaxes(query, 1, 2).astype(jnp.float32), ((0, 0), (0, 0), (0, pad), (0, 0)))
        v = jnp.pad(jnp.swapaxes(value, 1, 2).astype(jnp.float32), ((0, 0), (0, 0), (0, pad), (0, 0)))
        keep = jnp.pad(keep, ((0, 0), (0, pad)))  # padding positions are masked keys
        k = q * lax.rsqrt(jnp.maximum(jnp.sum(q * q, axis=-1, keepdims=True), 1e-12))
        shape = (d, self.num_hashes, max(1, self.num_buckets // 2))
        rotations = self.param("rotations", nn.initializers.normal(1.0), shape, self.param_dtype)
        if self.num_buckets == 1:
            buckets = jnp.zeros((B, H, self.num_hashes, L + pad), jnp.int32)
        else:
            buckets = hash_buckets(k, lax.stop_gradient(rotations).astype(jnp.float32))
        rounds = [self._round(q, k, v, keep, buckets[:, :, r], is_causal, C) for r in range(self.num_hashes)]
        outs, lses = jnp.stack([o for o, _ in rounds]), jnp.stack([s for _, s in rounds])  # [n, B, H, L', ·]
        weights = jax.nn.softmax(lses, axis=0)[..., None]
        out = jnp.sum(weights * outs, axis=0)[:, :, :L]
        dtype = self.dtype or jnp.result_type(query, value)
        return jnp.swapaxes(out, 1, 2).astype(dtype)

    def _round(self, q, k, v, keep, buckets, is_causal, C):
        """One hashing round: sort, attend within chunk pairs, unsort -> (out `[B, H, L', d_v]`, lse `[B, H, L']`)."""
        B, H, Lp, d = q.shape
        positions = jnp.arange(Lp, dtype=jnp.int32)
        order = jnp.argsort(buckets * Lp + positions[None, None], axis=-1)  # stable: by bucket, then position
        take = lambda x, idx: jnp.take_along_axis(x, idx[..., None] if x.ndim == 4 else idx, axis=2)
        sq, sk, sv, sb = (take(x, order) for x in (q, k, v, buckets))
        spos = take(jnp.broadcast_to(positions, (B, H, Lp)), order)
        skeep = take(jnp.broadcast_to(keep[:, None], (B, H, Lp)), order)
        n = Lp // C
        chunk = lambda x: x.reshape(B, H, n, C, *x.shape[3:])
        look_back = lambda x: x if n == 1 else jnp.concatenate([jnp.roll(x, 1, axis=2), x], axis=3)
        cq, cb, cpos = chunk(sq), chunk(sb), chunk(spos)
        kk, kv, kb, kpos, kkeep = (look_back(chunk(x)) for x in (sk, sv, sb, spos, skeep))
        logits = jnp.einsum("bhncd,bhnkd->bhnck", cq, kk, precision=self.precision) / jnp.sqrt(jnp.float32(d))
        allowed = (cb[..., :, None] == kb[..., None, :]) & kkeep[..., None, :]
        if is_causal:
            allowed &= allowed_by_position(cpos[..., :, None], kpos[..., None, :], True)
        logits = jnp.where(allowed, logits, _MASKED)
        if self.mask_self:
            logits = jnp.where(kpos[..., None, :] == cpos[..., :, None], jnp.minimum(logits, _SELF), logits)
        lse = jax.nn.logsumexp(logits, axis=-1)
        out = jnp.einsum("bhnck,bhnkd->bhncd", jnp.exp(logits - lse[..., None]), kv, precision=self.precision)
        inverse = jnp.argsort(order, axis=-1)
        return take(out.reshape(B, H, Lp, -1), inverse), take(lse.reshape(B, H, Lp), inverse)
