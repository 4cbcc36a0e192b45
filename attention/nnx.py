"""`MultiHeadAttention` as a `flax.nnx` module: a drop-in for `flax.nnx.MultiHeadAttention` (0.12).

An adapter: Flax NNX's constructor and call map onto `attention.multihead`, which the Linen layer
shares (Flax's shims: `attention.flax_compat`), under Flax's `nnx.Param` paths and shapes.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn import dtypes, initializers
from flax.nnx.nn.linear import default_kernel_init

from attention import family, flax_compat
from attention import multihead as mh
from attention.cache import LAYOUT as CACHE_LAYOUT
from attention.cache import BEAM_ROWS, VARIABLES
from attention.checks import require, require_positive_ints
from attention.flax_compat import load_linen_params, to_linen_params  # noqa: F401 (attention.nnx's API)
from attention.geometry import HeadGeometry
from attention.nnx_state import KEPT, DecodeState

_EMPTY: Mapping[str, Any] = MappingProxyType({})


class MultiHeadAttention(DecodeState, nnx.Module):
    """Multi-head attention with `num_kv_heads` key/value heads (MHA, GQA or MQA).

    Arguments: `flax.nnx.MultiHeadAttention`'s, plus, keyword-only, the options both faces take
    (docs/attention.md: num_kv_heads, v_head_dim, impl, block_sizes, fused_qkv, out_kernel_init,
    attention_type, attention_options, formulation, cache_cross_kv); a family member is its Linen
    module wrapped by `nnx.bridge.ToNNX`.

    Decoding: `init_cache` / `nnx.view(..., decode=True)` allocate `cached_key [batch..., G,
    max_length, d_k]`, `cached_value` and `cache_index [batch...]`, one position per sequence
    (`attention.cache`); a call's `lengths [batch...]` says how many new tokens are real. Under beam
    search a `beam_rows` table `[sources, beams, max_length]` in the decode state (the attribute
    `beam_rows`, an `nnx.Cache` the caller sets; `init_cache` clears it) is read in place
    (`attention.beams`). The decode state is the layer's: `init_cache` / `nnx.view(..., decode=True,
    batch_size=..., max_length=...)` set it up (for `cache_cross_kv`: empty, clearing a kept source).

    `cache_cross_kv`: the layer keeps its source's projected keys/values (`cross_key`, `cross_value`,
    head-first) in its decode state, in place of a KV cache: the first call that can write that state
    stores them, later calls read them instead of `inputs_k`/`inputs_v`, a call without the state
    projects them, and `decode` changes none of this (a cross-attention decodes by reusing its source).
    """

    def __init__(
        self,
        num_heads: int,
        in_features: int,
        qkv_features: int | None = None,
        out_features: int | None = None,
        num_kv_heads: int | None = None,
        in_kv_features: int | None = None,
        *,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        broadcast_dropout: bool = True,
        dropout_rate: float = 0.0,
        deterministic: bool | None = None,
        precision: Any = None,
        kernel_init: Callable = default_kernel_init,
        out_kernel_init: Callable | None = None,
        bias_init: Callable = initializers.zeros_init(),
        out_bias_init: Callable | None = None,
        use_bias: bool = True,
        normalize_qk: bool = False,
        attention_fn: Callable[..., jax.Array] | None = None,
        qkv_promote_dtype: Callable = dtypes.promote_dtype,
        out_promote_dtype: Callable = dtypes.promote_dtype,
        ln_promote_dtype: Callable = dtypes.promote_dtype,
        qkv_dot_general: Any = None,
        out_dot_general: Any = None,
        qkv_dot_general_cls: Any = None,
        out_dot_general_cls: Any = None,
        rngs: nnx.Rngs,
        keep_rngs: bool = True,
        decode: bool | None = None,
        kernel_metadata: Mapping[str, Any] = _EMPTY,
        out_kernel_metadata: Mapping[str, Any] = _EMPTY,
        bias_metadata: Mapping[str, Any] = _EMPTY,
        out_bias_metadata: Mapping[str, Any] = _EMPTY,
        query_ln_scale_metadata: Mapping[str, Any] = _EMPTY,
        key_ln_scale_metadata: Mapping[str, Any] = _EMPTY,
        impl: str = "vmap",
        block_sizes: tuple[int, int] | None = None,
        fused_qkv: bool = False,
        v_head_dim: int | None = None,
        attention_type: str = "softmax",
        attention_options: Mapping[str, Any] | None = None,
        formulation: Any = None,
        cache_cross_kv: bool = False,
    ):
        owner = f"{type(self).__name__}."
        require_positive_ints(owner, in_features=in_features)
        require_positive_ints(
            owner, optional=True, qkv_features=qkv_features, out_features=out_features, in_kv_features=in_kv_features
        )
        self.qkv_features, self.out_features, self.in_kv_features = (
            x if x is not None else in_features for x in (qkv_features, out_features, in_kv_features)
        )
        geometry = HeadGeometry.resolve(
            num_heads,
            num_kv_heads=num_kv_heads,
            v_head_dim=v_head_dim,
            features=self.qkv_features,
            features_name="qkv_features",
            owner=owner,
        )
        self.geometry = geometry
        self.num_heads, self.num_kv_heads, self.head_dim, self.v_head_dim = dataclasses.astuple(geometry)
        self.blocks = mh.check_settings(
            owner, geometry, impl=impl, block_sizes=block_sizes, fused_qkv=fused_qkv, dropout_rate=dropout_rate
        )
        require(
            owner,
            "in_kv_features",
            self.in_kv_features,
            not fused_qkv or self.in_kv_features == in_features,
            f"None or in_features ({in_features}): fused_qkv=True is self-attention",
        )
        options = family.check_options(attention_type, attention_options)  # checks the name too
        arguments = locals()
        for name in KEPT:
            setattr(self, name, arguments[name])
        self.attention_options = MappingProxyType(options)
        spec = family.member(attention_type)
        if spec is not None:  # what can be refused before a call is refused here
            mh.check_member_call(
                type(self).__name__,
                self,
                geometry,
                is_self=True,
                values_are_keys=True,
                causal=False,
                decode=mh.steps_decode_state(bool(decode), cache_cross_kv),
                sow_weights=False,
            )
        self._make_layers(
            spec,
            geometry,
            options,
            rngs,
            kernel_init=kernel_init,
            bias_init=bias_init,
            out_kernel_init=out_kernel_init or kernel_init,
            out_bias_init=out_bias_init or bias_init,
            kernel_metadata=kernel_metadata,
            bias_metadata=bias_metadata,
            out_kernel_metadata=out_kernel_metadata or kernel_metadata,
            out_bias_metadata=out_bias_metadata or bias_metadata,
            query_ln=query_ln_scale_metadata,
            key_ln=key_ln_scale_metadata,
        )
        self.rngs = rngs.dropout.fork() if keep_rngs and dropout_rate > 0 else None
        for name in (*VARIABLES, BEAM_ROWS, *mh.CROSS_KV):
            setattr(self, name, nnx.data(None))

    def _make_layers(
        self,
        spec,
        geometry,
        options,
        rngs,
        *,
        kernel_init,
        bias_init,
        out_kernel_init,
        out_bias_init,
        kernel_metadata,
        bias_metadata,
        out_kernel_metadata,
        out_bias_metadata,
        query_ln,
        key_ln,
    ):
        """The projections, the member, the norms and W^O in Flax's order: the same rngs give the same parameters."""
        H, G, d_k, d_v = dataclasses.astuple(geometry)
        common = dict(
            dtype=self.dtype, param_dtype=self.param_dtype, use_bias=self.use_bias, precision=self.precision, rngs=rngs
        )
        linear = functools.partial(
            nnx.LinearGeneral,
            kernel_init=kernel_init,
            bias_init=bias_init,
            promote_dtype=self.qkv_promote_dtype,
            dot_general=self.qkv_dot_general,
            dot_general_cls=self.qkv_dot_general_cls,
            kernel_metadata=kernel_metadata,
            bias_metadata=bias_metadata,
            **common,
        )
        in_features = self.in_features
        if self.fused_qkv:
            self.qkv = linear(in_features, out_features=(H + 2 * G, d_k))
        elif spec is None or not spec.projects:
            self.query = linear(in_features, out_features=(H, d_k))
            if spec is None or not spec.shared_qk:
                self.key = linear(self.in_kv_features, out_features=(G, d_k))
            self.value = linear(self.in_kv_features, out_features=(G, d_v))
        if spec is not None:
            member = nnx.bridge.ToNNX(mh.make_member(self, options, geometry, decode=False, kernel_init=kernel_init))
            shapes = mh.member_input_shapes(spec, geometry, (1,), 1, self.in_features, self.in_kv_features)
            nnx.bridge.lazy_init(member, *map(jnp.zeros, shapes), rngs=rngs.params())
            setattr(self, self.attention_type, member)
        norm = functools.partial(
            nnx.LayerNorm,
            d_k,
            use_bias=False,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            promote_dtype=self.ln_promote_dtype,
            rngs=rngs,
        )
        self.query_ln = norm(scale_metadata=query_ln) if self.normalize_qk else nnx.data(None)
        self.key_ln = norm(scale_metadata=key_ln) if self.normalize_qk else nnx.data(None)
        self.out = nnx.LinearGeneral(
            in_features=(H, d_v),
            out_features=self.out_features,
            axis=(-2, -1),
            kernel_init=out_kernel_init,
            bias_init=out_bias_init,
            promote_dtype=self.out_promote_dtype,
            dot_general=self.out_dot_general,
            dot_general_cls=self.out_dot_general_cls,
            kernel_metadata=out_kernel_metadata,
            bias_metadata=out_bias_metadata,
            **common,
        )

    def __call__(
        self,
        inputs_q: jax.Array,
        inputs_k: jax.Array | None = None,
        inputs_v: jax.Array | None = None,
        *,
        mask: jax.Array | None = None,
        deterministic: bool | None = None,
        rngs: nnx.Rngs | nnx.RngStream | None = None,
        sow_weights: bool = False,
        decode: bool | None = None,
        is_causal: bool = False,
        out_sharding: Any = None,
        qkv_sharding: Any = None,
        input_positions: jax.Array | None = None,
        head_mask: jax.Array | None = None,
        lengths: jax.Array | None = None,
    ) -> jax.Array:
        """`inputs_q [batch..., Lq, in_features]` -> `[batch..., Lq, out_features]`.

        `inputs_k`/`inputs_v`: `[batch..., Lk, in_kv_features]`.

        As Flax's, plus head_mask (float, broadcastable to `[batch..., H]`, scales each head before
        W^O) and lengths (with `decode`: the real new tokens per sequence, int `[batch...]`). Weights sown as
        Flax's layer sows them: `nnx.capture(layer, nnx.Intermediate)(x, sow_weights=True)` collects them.
        """
        decode = bool(decode if decode is not None else self.decode)
        call = flax_compat.nnx_call(
            self,
            inputs_q,
            inputs_k,
            inputs_v,
            decode=decode,
            lengths=lengths,
            input_positions=input_positions,
            deterministic=deterministic,
            rngs=rngs,
        )
        project = functools.partial(self._project, sharding=qkv_sharding)
        if self.attention_type != "softmax":
            x = self._family_attention(call, mask, is_causal, lengths, sow_weights, project, head_mask)
            return self.out(x, out_sharding=out_sharding)
        query, key, value = project(*call.inputs)
        kv_layout, read = call.kv_layout, None
        if call.decode:  # the cache mask is causal, at each sequence's offset
            in_place = mh.reads_beams_in_place(self.attention_fn, sow_weights, call.deterministic)
            read = self._use_cache(key, value, mask, lengths, in_place)
            key, value, mask, is_causal, kv_layout = read.key, read.value, read.mask, False, CACHE_LAYOUT
        options = dict(
            mask=mask,
            dropout_rate=self.dropout_rate,
            dropout_rng=call.dropout_rng,
            deterministic=call.deterministic,
            broadcast_dropout=self.broadcast_dropout,
            dtype=self.dtype,
            precision=self.precision,
        )
        if self.attention_fn is not None:
            extra = {} if input_positions is None else {"input_positions": input_positions}
            key, value = flax_compat.flax_layout(kv_layout, key, value)
            x = self.attention_fn(
                query, key, value, **options, module=self if sow_weights else None, is_causal=is_causal, **extra
            )
            return self.out(mh.gate_heads(x, head_mask, self.num_heads), out_sharding=out_sharding)
        sow = functools.partial(self.sow, nnx.Intermediate, "attention_weights") if sow_weights else None
        x = mh.exact_heads(
            query,
            key,
            value,
            sow=sow,
            impl=self.impl,
            **call.blocks,
            **options,
            beam_rows=None if read is None else read.beam_rows,
            head_mask=head_mask,
            is_causal=is_causal,
            formulation=self.formulation,
            kv_layout=kv_layout,
        )
        return self.out(x, out_sharding=out_sharding)

    def _family_attention(self, call, mask, is_causal, lengths, sow_weights, project, head_mask):
        """Heads `[batch..., Lq, H, d_v]` from the `attention_type` member, after checking it can serve this call."""
        (inputs_q, inputs_k, inputs_v), name, decode = call.inputs, self.attention_type, call.decode
        causal = is_causal or decode
        spec = mh.check_member_call(
            type(self).__name__,
            self,
            self.geometry,
            is_self=inputs_k is inputs_q and inputs_v is inputs_q,
            values_are_keys=inputs_v is inputs_k,
            causal=causal,
            decode=decode,
            sow_weights=sow_weights,
        )
        member = getattr(self, name)
        own_state = spec.decode == "state" and member.to_nnx__module.decode
        family.check_state_decode(name, spec, decode=decode, in_decode_mode=own_state, lengths=lengths)
        use_cache = lambda k, v, m, in_place: self._use_cache(k, v, m, lengths, in_place)
        return mh.family_heads(
            spec,
            member,
            project,
            use_cache,
            call.inputs,
            mask,
            num_heads=self.num_heads,
            causal=causal,
            decode=decode,
            head_mask=head_mask,
            kv_layout=call.kv_layout,
            mutable=["cache"] if own_state else False,
        )  # ToNNX keeps the new state

    def _project(self, inputs_q, inputs_k, inputs_v, sharding=None, shared_qk=False):
        """q `[batch..., Lq, H, d_k]`, k `[batch..., Lk, G, d_k]` (q if `shared_qk`), v `[batch..., Lk, G, d_v]`.

        Queries and keys are normed with `normalize_qk`. With `cache_cross_kv`, k and v are the kept
        source's `[batch..., G, Lk, d]` (`_cross_kv`).
        """
        if self.fused_qkv:
            mh.check_fused_inputs(True, inputs_k is inputs_q and inputs_v is inputs_q)
            qkv = self.qkv(inputs_q, out_sharding=sharding)
            query, key, value = jnp.split(qkv, [self.num_heads, self.num_heads + self.num_kv_heads], axis=-2)
        else:
            query = self.query(inputs_q, out_sharding=sharding)
            project_kv = lambda: (
                query if shared_qk else self.key(inputs_k, out_sharding=sharding),
                self.value(inputs_v, out_sharding=sharding),
            )
            key, value = self._cross_kv(project_kv) if self.cache_cross_kv else project_kv()
        if self.normalize_qk:
            query, key = self.query_ln(query), self.key_ln(key)
        return query, key, value
