"""`MultiHeadAttention`: a Flax Linen drop-in for `nn.MultiHeadDotProductAttention` with GQA/MQA.

Its call reads top to bottom as Flax's: the checks, the projections, the decode cache, attention
(`attention.attend`), the output projection. With `num_kv_heads == num_heads`, `v_head_dim=None` and
`fused_qkv=False` the parameter tree is Flax's (`query`/`key`/`value` kernels `[D, H, Dk]`, `out`
`[H, Dk, Dout]`): Flax checkpoints load.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention import beams, family
from attention.cache import CROSS_KV, LAYOUT, KVCache, CacheRead, cross_kv
from attention.core import attend, check_layer_settings, relayout
from attention.family import layer_call
from attention.geometry import HeadGeometry
from attention.head import resolve
from attention.masks import and_masks, head_multiplier, structure_mask


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
        # the inputs by Flax's rules, then the settings
        inputs_k, inputs_v = flax_inputs(inputs_q, inputs_k, inputs_v, inputs_kv)
        owner = f"{type(self).__name__}."
        features = self.qkv_features or inputs_q.shape[-1]
        geometry = HeadGeometry.resolve(
            self.num_heads,
            num_kv_heads=self.num_kv_heads,
            v_head_dim=self.v_head_dim,
            features=features,
            features_name="qkv_features",
            owner=owner,
        )
        blocks = check_layer_settings(
            owner,
            geometry,
            impl=self.impl,
            block_sizes=self.block_sizes,
            fused_qkv=self.fused_qkv,
            dropout_rate=self.dropout_rate,
        )
        self._check_call(inputs_q, inputs_k, inputs_v, lengths)
        decode = self.decode and not self.cache_cross_kv  # a layer keeping its source decodes by reusing it
        kv_layout = LAYOUT if self.cache_cross_kv and not self.fused_qkv else "BTNH"  # the projected K/V's

        if self.attention_type != "softmax":  # a cheaper member of the family (attention.family)
            x = self._family_heads(
                geometry, (inputs_q, inputs_k, inputs_v), mask, is_causal, decode, kv_layout, sow_weights, lengths
            )
        else:
            deterministic, dropout_rng = self._dropout(deterministic, dropout_rng)
            query, key, value = self._project(inputs_q, inputs_k, inputs_v, geometry)
            read = None
            if decode:  # the KV cache: created by init (nothing to read yet), stepped by every later call
                in_place = self.attention_fn is None and not sow_weights and bool(deterministic)
                read = self._decode_step(key, value, mask, in_place, lengths)
            if read is not None:  # attend over the cache; its mask is causal, at the right offset
                key, value, mask, is_causal, kv_layout = read.key, read.value, read.mask, False, LAYOUT
            if self.attention_fn is not None:
                key, value = relayout(key, kv_layout, "BTNH"), relayout(value, kv_layout, "BTNH")
                x = self._flax_attention_fn(query, key, value, mask, is_causal, deterministic, dropout_rng, sow_weights)
            elif read is not None and read.beam_rows is not None:  # beam search's cache, read in place
                x = beams.history_attention(
                    query,
                    key,
                    value,
                    read.beam_rows,
                    read.mask,
                    dtype=self.dtype,
                    precision=self.precision,
                    formulation=self.formulation,
                )
            else:
                impl = "vmap" if sow_weights and self.impl == "auto" else self.impl
                x, weights = attend(
                    query,
                    key,
                    value,
                    impl=impl,
                    **blocks,
                    mask=mask,
                    is_causal=is_causal,
                    dropout_rate=self.dropout_rate,
                    dropout_rng=dropout_rng,
                    deterministic=deterministic,
                    broadcast_dropout=self.broadcast_dropout,
                    dtype=self.dtype,
                    precision=self.precision,
                    formulation=self.formulation,
                    kv_layout=kv_layout,
                )
                if sow_weights:
                    self._sow(weights, impl)

        if head_mask is not None:  # x: heads [batch..., Lq, H, d_v], each scaled before W^O
            x = x * head_multiplier(head_mask, x.shape[:-3], self.num_heads, x.dtype)
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

    def _check_call(self, inputs_q, inputs_k, inputs_v, lengths):
        """What a call adds to the settings: a fused projection needs self-attention, the einsum classes an
        `attention_fn`, `lengths` a decode layer; and the `attention_options` of the exact attention (none)."""
        if self.fused_qkv and not (inputs_k is inputs_q and inputs_v is inputs_q):
            raise ValueError(
                "fused_qkv=True projects q, k and v from one input; it needs self-attention "
                "(inputs_k and inputs_v None or the same array as inputs_q)"
            )
        if (self.qk_attn_weights_einsum_cls or self.attn_weights_value_einsum_cls) and self.attention_fn is None:
            raise ValueError(
                "qk_attn_weights_einsum_cls / attn_weights_value_einsum_cls are forwarded to "
                "attention_fn; set attention_fn (e.g. flax.linen.dot_product_attention) too"
            )
        if lengths is not None and not self.decode:
            raise ValueError("lengths is a decode argument (the real new tokens per sequence); pass decode=True")
        if self.attention_type == "softmax" and self.attention_options:
            raise ValueError(
                f"attention_options = {dict(self.attention_options)!r}: {sorted(self.attention_options)} not "
                "settable for attention_type='softmax'; expected keys among ()"
            )

    def _dropout(self, deterministic, dropout_rng):
        """(deterministic, the dropout key or None), resolved as `flax.linen`'s layer resolves them."""
        deterministic = self.dropout_rate == 0.0 or nn.merge_param("deterministic", self.deterministic, deterministic)
        return deterministic, dropout_rng if deterministic or dropout_rng is not None else self.make_rng("dropout")

    def _sow(self, weights, impl):  # Flax sows float32 weights under force_fp32_for_softmax
        if weights is None:
            raise ValueError(
                f"sow_weights=True needs the attention weights, which impl={impl!r} does not "
                "expose; use impl='vmap', 'einsum' or 'auto'"
            )
        self.sow(
            "intermediates",
            "attention_weights",
            weights.astype(jnp.float32) if self.force_fp32_for_softmax else weights,
        )

    def _family_heads(self, geometry, inputs, mask, is_causal, decode, kv_layout, sow_weights, lengths):
        """Heads `[batch..., Lq, H, d_v]` from the `attention_type` member, after checking it can serve this call."""
        options = family.check_options(self.attention_type, self.attention_options)  # checks the name too
        inputs_q, inputs_k, inputs_v = inputs
        causal = is_causal or decode
        variant = layer_call.check_member_call(
            type(self).__name__,
            self,
            geometry,
            is_self=inputs_k is inputs_q and inputs_v is inputs_q,
            values_are_keys=inputs_v is inputs_k,
            causal=causal,
            decode=decode,
            sow_weights=sow_weights,
        )
        family.check_state_decode(
            self.attention_type,
            variant,
            decode=decode,
            lengths=lengths,
            in_decode_mode=decode and variant.decode == "state",
        )
        module = layer_call.make_member(self, options, geometry, decode=decode, kernel_init=self.kernel_init)
        return layer_call.family_heads(
            variant,
            module,
            functools.partial(self._project, geometry=geometry),
            functools.partial(self._decode_step, lengths=lengths),
            inputs,
            mask,
            num_heads=self.num_heads,
            causal=causal,
            decode=decode,
            kv_layout=kv_layout,
        )

    def _flax_attention_fn(self, query, key, value, mask, is_causal, deterministic, dropout_rng, sow_weights):
        """The user's `attention_fn`, called as Flax calls it: K/V `[batch..., Lk, G, D]`, causality ANDed into the
        mask (Flax Linen's takes no `is_causal`), keyword arguments it does not take filtered out."""
        mask = and_masks(mask, structure_mask(query.shape[-3], key.shape[-3], is_causal, None))
        kwargs = dict(
            mask=mask,
            dropout_rng=dropout_rng,
            dropout_rate=self.dropout_rate,
            broadcast_dropout=self.broadcast_dropout,
            deterministic=deterministic,
            dtype=self.dtype,
            precision=self.precision,
            force_fp32_for_softmax=self.force_fp32_for_softmax,
            qk_attn_weights_einsum=self.qk_attn_weights_einsum_cls and self.qk_attn_weights_einsum_cls(),
            attn_weights_value_einsum=self.attn_weights_value_einsum_cls and self.attn_weights_value_einsum_cls(),
        )
        assert self.attention_fn is not None  # the caller's branch
        accepted = inspect.signature(self.attention_fn).parameters
        kwargs = {k: v for k, v in kwargs.items() if k in accepted}
        if sow_weights:
            kwargs["module"] = self
        return self.attention_fn(query, key, value, **kwargs)

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
        """(key, value) `[batch..., G, Ls, D]` from the decode state if kept (`cache_cross_kv`), else projected (and
        kept if the state can be written)."""
        stored = (
            tuple(self.get_variable("cache", n) for n in CROSS_KV) if self.has_variable("cache", CROSS_KV[0]) else None
        )
        fill = self.is_mutable_collection("cache") and not self.is_initializing()
        return cross_kv(stored, project_kv, functools.partial(self.put_variable, "cache") if fill else None)

    def _decode_step(self, key, value, mask, beams_in_place, lengths=None) -> CacheRead | None:
        """The `cache` collection's `KVCache`: created at `init` (sized by its inputs; None: nothing to read yet),
        else stepped with key `[batch..., L_new, G, d_k]` and value (`KVCache.step`) -> what attention reads."""
        cache = KVCache.load(self.variables.get("cache", {}))
        if cache is None:
            dtype = self.dtype or key.dtype  # the compute dtype: a projection's dot_general may return a wider one
            max_length, G, d_k = key.shape[-3:]
            cache = KVCache.empty(
                key.shape[:-3], max_length, G, d_k, value.shape[-1], dtype, per_sequence=self.per_sequence_index
            )
            read = None
        else:
            cache, read = cache.step(
                key,
                value,
                mask,
                num_heads=self.num_heads,
                lengths=lengths,
                formulation=resolve(self.formulation),
                beams_in_place=beams_in_place,
            )
        for name, x in cache.store().items():
            self.put_variable("cache", name, x)
        return read


def flax_inputs(inputs_q, inputs_k, inputs_v, inputs_kv):
    """(inputs_k, inputs_v) by `flax.linen.MultiHeadDotProductAttention`'s rules, errors and warnings: k defaults to
    q, v to k; `inputs_kv` (deprecated) sets both. Called from the layer's `__call__` (the warnings' stacklevel)."""
    if inputs_kv is not None:
        if inputs_k is not None or inputs_v is not None:
            raise ValueError(
                "If either `inputs_k` or `inputs_v` is not None, `inputs_kv` must be None. If "
                "`inputs_kv` is not None, both `inputs_k` and `inputs_v` must be None. We recommend "
                "using `inputs_k` and `inputs_v` args, since `inputs_kv` will be deprecated soon. "
                "See https://github.com/google/flax/discussions/3389 for more information."
            )
        warnings.warn(
            "The inputs_kv arg will be deprecated soon. Use inputs_k and inputs_v instead. "
            "See https://github.com/google/flax/discussions/3389 for more information.",
            DeprecationWarning,
            stacklevel=2,
        )
        return inputs_kv, inputs_kv
    if inputs_k is None:
        if inputs_v is not None:
            raise ValueError(
                "`inputs_k` cannot be None if `inputs_v` is not None. To have both `inputs_k` and "
                "`inputs_v` be the same value, pass in the value to `inputs_k` and leave `inputs_v` as None."
            )
        inputs_k = inputs_q
    if inputs_v is None:
        return inputs_k, inputs_k
    # Flax's heuristic for a mask passed positionally (the pre-0.7.4 signature)
    if inputs_v.ndim >= 2 and inputs_v.shape[-1] == inputs_v.shape[-2]:
        warnings.warn(
            f"You are passing an array of shape {inputs_v.shape} to the `inputs_v` arg, when you "
            "may have intended to pass it to the `mask` arg. As of Flax version 0.7.4, the "
            "function signature of MultiHeadDotProductAttention's `__call__` method has changed "
            "to `__call__(inputs_q, inputs_k=None, inputs_v=None, *, inputs_kv=None, mask=None, "
            "deterministic=None)`. Use the kwarg `mask` instead. See "
            "https://github.com/google/flax/discussions/3389 and read the docstring for more information.",
            DeprecationWarning,
            stacklevel=2,
        )
    return inputs_k, inputs_v
