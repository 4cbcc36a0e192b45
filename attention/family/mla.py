"""Multi-head latent attention (DeepSeek-AI 2024, "DeepSeek-V2", §2.1.2), without the decoupled RoPE.

Keys and values of all heads come from one compressed latent per token:

    c_t = W^{DKV} h_t ∈ R^{d_c},   k_t = W^{UK} c_t,   v_t = W^{UV} c_t,   q_t = W^Q h_t

and the decode cache holds only c_t: d_c elements per token and layer, against G (d_k + d_v)
for MHA/GQA/MQA. A decode step never rebuilds K or V: W^{UK} is absorbed into the query
(q_tᵀ k_j = (W^{UKᵀ} q_t)ᵀ c_j) and W^{UV} applied after the weighted sum of latents, so a step
reads the cache once (O(L d_c) per head). The full pass up-projects K and V and runs the
layer's exact attention (`attention.attend`, any `impl`): cost as softmax, O(N²). Parameters:
"query" `[D, H, d_k]`, "kv_down" `[D_kv, d_c]`, "key_up" `[d_c, H, d_k]`, "value_up" `[d_c, H, d_v]`.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
from attention import cache as kv_cache
from attention.geometry import require_positive_ints
from attention.core import attend
from attention.family.member import LayerFilled
from attention.head import softmax
from attention.masks import and_masks, as_bool_mask


class MLA(LayerFilled):
    """Attention over a shared low-rank KV latent of width `latent_dim`, with a latent decode cache."""

    num_heads: int = 1  # set by the layer
    head_dim: int = 1  # d_k, set by the layer
    v_head_dim: int = 1  # d_v, set by the layer
    latent_dim: int | None = None  # d_c (None: 4 d_k, DeepSeek-V2's ratio)
    use_bias: bool = True  # on the query and down projections (the up projections have none)
    impl: str = "vmap"
    decode: bool = False
    kernel_init: Any = nn.linear.default_kernel_init

    @nn.compact
    def __call__(self, inputs_q, inputs_kv, *, mask=None, is_causal=False):
        """inputs_q `[B, Lq, D]`, inputs_kv `[B, Lk, D_kv]`, mask `[B|1, H|1, Lq|1, Lk|1]` -> `[B, Lq, H, d_v]`."""
        H, d_k, d_v = self.num_heads, self.head_dim, self.v_head_dim
        require_positive_ints("mla ", optional=True, latent_dim=self.latent_dim)
        d_c = self.latent_dim or 4 * d_k
        dense = functools.partial(
            nn.DenseGeneral,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            precision=self.precision,
            kernel_init=self.kernel_init,
        )
        query = dense(features=(H, d_k), use_bias=self.use_bias, name="query")(inputs_q)
        latent = dense(features=d_c, use_bias=self.use_bias, name="kv_down")(inputs_kv)
        w_uk = self._up_kernel("key_up", d_c, H, d_k)
        w_uv = self._up_kernel("value_up", d_c, H, d_v)
        if self.decode and self.has_variable("cache", "cached_latent"):
            return self._decode_step(query, latent, mask, w_uk.astype(query.dtype), w_uv.astype(query.dtype))
        if self.decode:  # init: size the cache (never written at init), attend over the inputs
            self.variable("cache", "cached_latent", jnp.zeros, latent.shape, self.dtype or latent.dtype)
            self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
            is_causal = True
        up = lambda w: jnp.einsum("bkc,chd->bkhd", latent, w.astype(latent.dtype), precision=self.precision)
        out, _ = attend(
            query,
            up(w_uk),
            up(w_uv),
            mask=mask,
            is_causal=is_causal,
            impl=self.impl,
            dtype=self.dtype,
            precision=self.precision,
            formulation=self.formulation,
        )
        return out

    def _up_kernel(self, name, d_c, H, d):
        """`[d_c, H, d]`, initialised as a Dense kernel with fan-in d_c."""
        init = lambda rng, shape, dtype: self.kernel_init(rng, (d_c, H * d), dtype).reshape(shape)
        return self.param(name, init, (d_c, H, d), self.param_dtype)

    def _decode_step(self, query, latent, mask, w_uk, w_uv):
        """Append the new latents; attend with W^{UK} absorbed into the query, W^{UV} applied last."""
        cache = self.variable("cache", "cached_latent")
        index = self.variable("cache", "cache_index")
        B, max_length, d_c = cache.value.shape
        new_length = query.shape[1]
        if latent.shape[0] != B or new_length > max_length:
            raise ValueError(
                f"mla decode: the cache holds {max_length} positions for batch {B}, got queries {query.shape}"
            )
        cur = index.value  # the latent is one KV head's cache: [B, 1, L, d_c]
        cache.value = kv_cache.write(cache.value[:, None], latent[:, :, None], cur)[:, 0]
        index.value = cur + new_length
        d_k = query.shape[-1]
        q_latent = jnp.einsum(
            "bqhd,chd->bhqc", query * jnp.asarray(1 / math.sqrt(d_k), query.dtype), w_uk, precision=self.precision
        )
        logits = jnp.einsum(
            "bhqc,bkc->bhqk",
            q_latent,
            cache.value.astype(query.dtype),
            precision=self.precision,
            preferred_element_type=jnp.float32,
        )
        mask = and_masks(
            as_bool_mask("mask", mask, (B, self.num_heads, new_length, max_length)),
            kv_cache.causal_mask(cur, new_length, max_length),
        )
        weights = softmax(logits, mask, None).astype(query.dtype)
        out_latent = jnp.einsum("bhqk,bkc->bqhc", weights, cache.value.astype(query.dtype), precision=self.precision)
        return jnp.einsum("bqhc,chd->bqhd", out_latent, w_uv, precision=self.precision)
