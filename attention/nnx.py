"""`MultiHeadAttention` as a `flax.nnx` module: a drop-in for `flax.nnx.MultiHeadAttention` (0.12).

Its call reads top to bottom as Flax's: the checks, the projections, the decode cache, attention
(`attention.attend`), the output projection; its parameters are Flax's `nnx.Param` paths and shapes.
The decode state (`init_cache`, `nnx.view`) is `attention.nnx_state`'s.
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

from flax.nnx.module import first_from

from attention import beams, family
from attention.cache import BEAM_ROWS, CROSS_KV, LAYOUT, VARIABLES
from attention.core import attend, check_layer_settings, relayout
from attention.family import layer_call
from attention.geometry import HeadGeometry, require, require_positive_ints
from attention.masks import head_multiplier
from attention.nnx_params import load_linen_params, to_linen_params  # noqa: F401 (attention.nnx's API)
from attention.nnx_state import SETTINGS, DecodeState

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
        self.blocks = check_layer_settings(
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
        for name in SETTINGS:
            setattr(self, name, arguments[name])
        self.attention_options = MappingProxyType(options)
        variant = family.member(attention_type)
        if variant is not None:  # what can be refused before a call is refused here
            layer_call.check_member_call(
                type(self).__name__,
                self,
                geometry,
                is_self=True,
                values_are_keys=True,
                causal=False,
                decode=bool(decode) and not cache_cross_kv,
                sow_weights=False,
            )
        self._make_layers(
            variant,
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
        for name in (*VARIABLES, BEAM_ROWS, *CROSS_KV):
            setattr(self, name, nnx.data(None))

    def _make_layers(
        self,
        variant,
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
        elif variant is None or not variant.projects:
            self.query = linear(in_features, out_features=(H, d_k))
            if variant is None or not variant.shared_qk:
                self.key = linear(self.in_kv_features, out_features=(G, d_k))
            self.value = linear(self.in_kv_features, out_features=(G, d_v))
        if variant is not None:
            member = nnx.bridge.ToNNX(
                layer_call.make_member(self, options, geometry, decode=False, kernel_init=kernel_init)
            )
            shapes = layer_call.member_input_shapes(variant, geometry, (1,), 1, self.in_features, self.in_kv_features)
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
        # the inputs by Flax's rules, then the call's arguments
        inputs_k, inputs_v = flax_inputs(inputs_q, inputs_k, inputs_v)
        decode = bool(decode if decode is not None else self.decode)
        self._check_call(inputs_q, decode, lengths, input_positions)
        steps_state = decode and not self.cache_cross_kv  # a layer keeping its source decodes by reusing it
        kv_layout = LAYOUT if self.cache_cross_kv and not self.fused_qkv else "BTNH"  # the projected K/V's
        project = functools.partial(self._project, sharding=qkv_sharding)

        if self.attention_type != "softmax":  # a cheaper member of the family (attention.family)
            inputs = (inputs_q, inputs_k, inputs_v)
            x = self._family_heads(inputs, mask, is_causal, steps_state, kv_layout, sow_weights, lengths, project)
        else:
            deterministic, dropout_rng = self._dropout(deterministic, rngs)
            query, key, value = project(inputs_q, inputs_k, inputs_v)
            read = None
            if steps_state:  # the KV cache, set up by init_cache / nnx.view; its mask is causal, at each offset
                in_place = self.attention_fn is None and not sow_weights and bool(deterministic)
                read = self._decode_step(key, value, mask, lengths, in_place)
                key, value, mask, is_causal, kv_layout = read.key, read.value, read.mask, False, LAYOUT
            options = dict(
                mask=mask,
                dropout_rate=self.dropout_rate,
                dropout_rng=dropout_rng,
                deterministic=deterministic,
                broadcast_dropout=self.broadcast_dropout,
                dtype=self.dtype,
                precision=self.precision,
            )
            if self.attention_fn is not None:  # called as Flax calls it, K/V `[batch..., Lk, G, D]`
                extra = {} if input_positions is None else {"input_positions": input_positions}
                key, value = relayout(key, kv_layout, "BTNH"), relayout(value, kv_layout, "BTNH")
                module = self if sow_weights else None
                x = self.attention_fn(query, key, value, **options, module=module, is_causal=is_causal, **extra)
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
                    **self.blocks,
                    **options,
                    is_causal=is_causal,
                    formulation=self.formulation,
                    kv_layout=kv_layout,
                )
                if sow_weights:
                    self._sow(weights, impl)

        if head_mask is not None:  # x: heads [batch..., Lq, H, d_v], each scaled before W^O
            x = x * head_multiplier(head_mask, x.shape[:-3], self.num_heads, x.dtype)
        return self.out(x, out_sharding=out_sharding)

    def _check_call(self, inputs_q, decode, lengths, input_positions):
        """The call's arguments that Flax's has or ours adds: the input width, lengths, input_positions."""
        require(
            "",
            "inputs_q features",
            inputs_q.shape[-1],
            inputs_q.shape[-1] == self.in_features,
            f"in_features = {self.in_features} (shape {inputs_q.shape})",
        )
        if lengths is not None and not decode:
            raise ValueError("lengths is a decode argument (the real new tokens per sequence); pass decode=True")
        if input_positions is not None and self.attention_fn is None:
            raise ValueError(
                "input_positions is forwarded to attention_fn, and attention_fn is None; set an "
                "attention_fn that takes it (e.g. nnx.dot_product_attention_with_rope)"
            )

    def _dropout(self, deterministic, rngs):
        """(deterministic, the dropout key or None), resolved as `flax.nnx.MultiHeadAttention` resolves them."""
        if self.dropout_rate == 0.0:
            return True, None
        deterministic = first_from(
            deterministic,
            self.deterministic,
            error_msg=(
                "No `deterministic` argument was provided to MultiHeadAttention as either a __call__ argument or "
                "class attribute (it is needed when dropout_rate > 0)."
            ),
        )
        rngs = self.rngs if rngs is None else rngs.dropout if isinstance(rngs, nnx.Rngs) else rngs
        if deterministic:
            return True, None
        if rngs is None:
            raise ValueError(
                "rngs must be provided to __call__ when dropout is on and the layer was built with keep_rngs=False"
            )
        return False, rngs()

    def _sow(self, weights, impl):
        if weights is None:
            raise ValueError(
                f"sow_weights=True needs the attention weights, which impl={impl!r} does not "
                "expose; use impl='vmap', 'einsum' or 'auto'"
            )
        self.sow(nnx.Intermediate, "attention_weights", weights)

    def _family_heads(self, inputs, mask, is_causal, decode, kv_layout, sow_weights, lengths, project):
        """Heads `[batch..., Lq, H, d_v]` from the `attention_type` member, after checking it can serve this call."""
        (inputs_q, inputs_k, inputs_v), name = inputs, self.attention_type
        causal = is_causal or decode
        variant = layer_call.check_member_call(
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
        own_state = variant.decode == "state" and member.to_nnx__module.decode
        family.check_state_decode(name, variant, decode=decode, in_decode_mode=own_state, lengths=lengths)
        decode_step = lambda k, v, m, in_place: self._decode_step(k, v, m, lengths, in_place)
        return layer_call.family_heads(
            variant,
            member,
            project,
            decode_step,
            inputs,
            mask,
            num_heads=self.num_heads,
            causal=causal,
            decode=decode,
            kv_layout=kv_layout,
            mutable=["cache"] if own_state else False,
        )  # ToNNX keeps the new state

    def _project(self, inputs_q, inputs_k, inputs_v, sharding=None, shared_qk=False):
        """q `[batch..., Lq, H, d_k]`, k `[batch..., Lk, G, d_k]` (q if `shared_qk`), v `[batch..., Lk, G, d_v]`.

        Queries and keys are normed with `normalize_qk`. With `cache_cross_kv`, k and v are the kept
        source's `[batch..., G, Lk, d]` (`_cross_kv`).
        """
        if self.fused_qkv:
            if not (inputs_k is inputs_q and inputs_v is inputs_q):
                raise ValueError(
                    "fused_qkv=True projects q, k and v from one input; it needs self-attention "
                    "(inputs_k and inputs_v None or the same array as inputs_q)"
                )
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


def flax_inputs(inputs_q, inputs_k, inputs_v):
    """(inputs_k, inputs_v) by `flax.nnx.MultiHeadAttention`'s rules: k defaults to q, v to k."""
    if inputs_k is None:
        if inputs_v is not None:
            raise ValueError(
                "inputs_k cannot be None if inputs_v is not None; to use one array for both, "
                "pass it as inputs_k and leave inputs_v None"
            )
        inputs_k = inputs_q
    return inputs_k, inputs_k if inputs_v is None else inputs_v
