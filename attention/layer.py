"""`MultiHeadAttention`: a Flax Linen drop-in for `nn.MultiHeadDotProductAttention` with GQA/MQA.

An adapter: Flax Linen's attributes and call map onto `attention.multihead`, which both faces
share (Flax's shims: `attention.flax_compat`; its class names: `attention.linen_names`). With
`num_kv_heads == num_heads`, `v_head_dim=None` and `fused_qkv=False` the parameter tree is
Flax's (`query`/`key`/`value` kernels `[D, H, Dk]`, `out` `[H, Dk, Dout]`): Flax checkpoints load.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention import family, flax_compat
from attention import multihead as mh
from attention.cache import LAYOUT as CACHE_LAYOUT
from attention.cache import KVCache
from attention.formulation import resolve


class MultiHeadAttention(nn.Module):
    """Multi-head attention with `num_kv_heads` key/value heads (MHA, GQA or MQA).

    Attributes: Flax's `MultiHeadDotProductAttention`'s, plus the options both faces take
    (docs/attention.md: num_kv_heads, v_head_dim, impl, block_sizes, fused_qkv, out_kernel_init,
    attention_type, attention_options, formulation, cache_cross_kv).

    Decoding (`decode=True`): `init` with the full-length input sizes the cache `[batch..., G,
    max_length, D]`; each later call appends its L_new >= 1 keys/values at `cache_index`, one position
    for the batch (`[]`, Flax's) or with `per_sequence_index` one per sequence (`[batch...]`, advanced
    by a call's `lengths`), and attends causally (`attention.cache`). Under beam search a `beam_rows`
    table `[sources, beams, max_length]` in the decode state is read in place (`attention.beams`).
    The decode state is the `cache` collection: an `apply` with it mutable writes it, `init` only
    sizes the KV cache (its inputs are placeholders).

    `cache_cross_kv`: the layer keeps its source's projected keys/values (`cross_key`, `cross_value`,
    head-first) in its decode state, in place of a KV cache: the first call that can write that state
    stores them, later calls read them instead of `inputs_k`/`inputs_v`, a call without the state
    projects them, and `decode` changes none of this (a cross-attention decodes by reusing its source).
    """

    num_heads: int
    dtype: Any = None
    param_dtype: Any = jnp.float32
    qkv_features: int | None = None
    out_features: int | None = None
    broadcast_dropout: bool = True
    dropout_rate: float = 0.0
    deterministic: bool | None = None
    precision: Any = None
    kernel_init: Callable = nn.linear.default_kernel_init
    out_kernel_init: Callable | None = None
    bias_init: Callable = nn.initializers.zeros_init()
    out_bias_init: Callable | None = None
    use_bias: bool = True
    attention_fn: Callable[..., jax.Array] | None = None
    decode: bool = False
    normalize_qk: bool = False
    force_fp32_for_softmax: bool = False
    qkv_dot_general: Any = None
    out_dot_general: Any = None
    qkv_dot_general_cls: Any = None
    out_dot_general_cls: Any = None
    qk_attn_weights_einsum_cls: Callable[..., Callable[..., jax.Array]] | None = None
    attn_weights_value_einsum_cls: Callable[..., Callable[..., jax.Array]] | None = None
    num_kv_heads: int | None = None
    impl: str = "vmap"
    fused_qkv: bool = False
    block_sizes: tuple[int, int] | None = None
    v_head_dim: int | None = None
    cache_cross_kv: bool = False
    attention_type: str = "softmax"
    attention_options: Mapping[str, Any] | None = None
    formulation: Any = None
    per_sequence_index: bool = False

    @nn.compact
    def __call__(
        self,
        inputs_q: jax.Array,
        inputs_k: jax.Array | None = None,
        inputs_v: jax.Array | None = None,
        *,
        inputs_kv: jax.Array | None = None,
        mask: jax.Array | None = None,
        deterministic: bool | None = None,
        dropout_rng: jax.Array | None = None,
        sow_weights: bool = False,
        head_mask: jax.Array | None = None,
        is_causal: bool = False,
        lengths: jax.Array | None = None,
    ) -> jax.Array:
        """Self-attention on `inputs_q [batch..., Lq, D]`, or cross-attention to `inputs_k`/`inputs_v`.

        mask: broadcastable to `[batch..., H, Lq, Lk]`: bool (True = attend) or numeric (non-zero = attend).
        head_mask: float, broadcastable to `[batch..., H]`; scales each head's output before W^O.
        sow_weights: sow the weights `[batch..., H, Lq, Lk]` as `intermediates/attention_weights`.
        lengths: with `decode` and `per_sequence_index`, the real new tokens per sequence, int `[batch...]`.
        Returns `[batch..., Lq, out_features or D]`.
        """
        call = flax_compat.linen_call(
            self, inputs_q, inputs_k, inputs_v, inputs_kv, deterministic, dropout_rng, lengths
        )
        if self.attention_type != "softmax":
            return self._output(
                self._family_attention(call, mask, is_causal, sow_weights, lengths, head_mask), inputs_q
            )
        query, key, value = self._project(*call.inputs, call.geometry)
        kv_layout, read = call.kv_layout, None
        if call.decode:  # None at init, which only sizes the cache
            in_place = mh.reads_beams_in_place(self.attention_fn, sow_weights, call.deterministic)
            read = self._use_cache(key, value, mask, in_place, lengths)
        if read is not None:  # the cache mask is causal, at the right offset
            key, value, mask, is_causal, kv_layout = read.key, read.value, read.mask, False, CACHE_LAYOUT
        if self.attention_fn is not None:
            key, value = flax_compat.flax_layout(kv_layout, key, value)
            x = flax_compat.call_attention_fn(
                self, query, key, value, mask, is_causal, call.deterministic, call.dropout_rng, sow_weights
            )
            return self._output(mh.gate_heads(x, head_mask, self.num_heads), inputs_q)
        x = mh.exact_heads(
            query,
            key,
            value,
            sow=self._sow if sow_weights else None,
            impl=self.impl,
            **call.blocks,
            mask=mask,
            beam_rows=None if read is None else read.beam_rows,
            head_mask=head_mask,
            is_causal=is_causal,
            dropout_rate=self.dropout_rate,
            dropout_rng=call.dropout_rng,
            deterministic=call.deterministic,
            broadcast_dropout=self.broadcast_dropout,
            dtype=self.dtype,
            precision=self.precision,
            formulation=self.formulation,
            kv_layout=kv_layout,
        )
        return self._output(x, inputs_q)

    def _sow(self, weights):  # Flax sows float32 weights under force_fp32_for_softmax
        self.sow(
            "intermediates",
            "attention_weights",
            weights.astype(jnp.float32) if self.force_fp32_for_softmax else weights,
        )

    def _output(self, x, inputs_q):
        """Heads `[batch..., Lq, H, d_v]` through W^O."""
        return nn.DenseGeneral(
            features=self.out_features or inputs_q.shape[-1],
            axis=(-2, -1),
            kernel_init=self.out_kernel_init or self.kernel_init,
            bias_init=self.out_bias_init or self.bias_init,
            use_bias=self.use_bias,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            precision=self.precision,
            dot_general=self.out_dot_general,
            dot_general_cls=self.out_dot_general_cls,
            name="out",
        )(x)

    def _family_attention(self, call, mask, is_causal, sow_weights, lengths, head_mask):
        """Heads `[batch..., Lq, H, d_v]` from the `attention_type` member, after checking it can serve this call."""
        decode, (inputs_q, inputs_k, inputs_v) = call.decode, call.inputs
        causal = is_causal or decode
        spec = mh.check_member_call(
            type(self).__name__,
            self,
            call.geometry,
            is_self=inputs_k is inputs_q and inputs_v is inputs_q,
            values_are_keys=inputs_v is inputs_k,
            causal=causal,
            decode=decode,
            sow_weights=sow_weights,
        )
        family.check_state_decode(
            self.attention_type,
            spec,
            decode=decode,
            lengths=lengths,
            in_decode_mode=decode and spec.decode == "state",
        )
        module = mh.make_member(self, call.options, call.geometry, decode=decode, kernel_init=self.kernel_init)
        project = functools.partial(self._project, geometry=call.geometry)
        use_cache = functools.partial(self._use_cache, lengths=lengths)
        return mh.family_heads(
            spec,
            module,
            project,
            use_cache,
            call.inputs,
            mask,
            num_heads=self.num_heads,
            causal=causal,
            decode=decode,
            head_mask=head_mask,
            kv_layout=call.kv_layout,
        )

    def _project(self, inputs_q, inputs_k, inputs_v, geometry, shared_qk=False):
        """q [batch..., Lq, H, Dk], k [batch..., Lk, G, Dk] (q when `shared_qk`), v [batch..., Lk, G, Dv]; qk-normed."""
        dense = functools.partial(
            nn.DenseGeneral,
            axis=-1,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=self.kernel_init,
            bias_init=self.bias_init,
            use_bias=self.use_bias,
            precision=self.precision,
            dot_general=self.qkv_dot_general,
            dot_general_cls=self.qkv_dot_general_cls,
        )
        H, G, d_k = geometry.num_heads, geometry.num_kv_heads, geometry.head_dim
        if self.fused_qkv:
            query, key, value = jnp.split(dense(features=(H + 2 * G, d_k), name="qkv")(inputs_q), [H, H + G], axis=-2)
        else:
            query = dense(features=(H, d_k), name="query")(inputs_q)
            project_kv = lambda: (
                query if shared_qk else dense(features=(G, d_k), name="key")(inputs_k),
                dense(features=(G, geometry.v_head_dim), name="value")(inputs_v),
            )
            key, value = self._cross_kv(project_kv) if self.cache_cross_kv else project_kv()
        if not self.normalize_qk:
            return query, key, value
        norm = functools.partial(nn.LayerNorm, use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype)
        return norm(name="query_ln")(query), norm(name="key_ln")(key), value

    def _cross_kv(self, project_kv):
        """(key, value) from the cache if stored (`cache_cross_kv`), else projected (stored if the cache is filling)."""
        stored = (
            tuple(self.get_variable("cache", n) for n in mh.CROSS_KV)
            if self.has_variable("cache", mh.CROSS_KV[0])
            else None
        )
        fill = self.is_mutable_collection("cache") and not self.is_initializing()
        return mh.cross_kv(stored, project_kv, functools.partial(self.put_variable, "cache") if fill else None)

    def _use_cache(self, key, value, mask, beams_in_place, lengths=None):
        """One `KVCache.step` over the `cache` collection -> what attention reads (`cache.Read`); None at init."""
        stored = KVCache.load(self.variables.get("cache", {}))
        if stored is None:  # init: size the cache, attend over the inputs as usual
            dtype = self.dtype or key.dtype  # the compute dtype: a projection's dot_general may return a wider one
            shape = (*key.shape[-3:], value.shape[-1])
            empty = KVCache.empty(key.shape[:-3], *shape, dtype, per_sequence=self.per_sequence_index)
            self._store_cache(empty)
            return None
        new, read = stored.step(
            key,
            value,
            mask,
            num_heads=self.num_heads,
            lengths=lengths,
            formulation=resolve(self.formulation),
            beams_in_place=beams_in_place,
        )
        self._store_cache(new)
        return read

    def _store_cache(self, cache):
        for name, x in cache.store().items():
            self.put_variable("cache", name, x)
