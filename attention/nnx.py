"""`MultiHeadAttention` as a `flax.nnx` module: a drop-in for `flax.nnx.MultiHeadAttention`.

The same constructor, call signature, `init_cache` / `set_view` and `nnx.Param` paths and
shapes as Flax's (0.12), so Flax NNX code and checkpoints run unchanged; the attention itself
is `attention.attend`, the function the Linen layer (`attention.layer`) calls. On top:
`impl`, `block_sizes`, `fused_qkv`, `v_head_dim`, the attention family's `attention_type`
(its Linen member wrapped by `nnx.bridge.ToNNX`, under the Linen layer's parameter paths), a
`head_mask` call argument, and a decode cache (`attention.cache`) that takes a multi-token
prompt in one call, keeps one position per sequence (`cache_index [batch...]`, so prompts of
different lengths decode together) and masks causally at every step, as the full pass does.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.module import first_from
from flax.nnx.nn import dtypes, initializers
from flax.nnx.nn.linear import default_kernel_init
from jax import lax

from attention import cache, family
from attention.core import IMPLS, attend
from attention.geometry import HeadGeometry
from attention.grouped import flatten_batch
from attention.masks import and_masks, as_bool_mask, head_multiplier

Array = Any
_EMPTY = MappingProxyType({})


class MultiHeadAttention(nnx.Module):
    """Multi-head attention with `num_kv_heads` key/value heads (MHA, GQA or MQA).

    Arguments are `flax.nnx.MultiHeadAttention`'s plus (keyword-only):
      impl: attention computation, one of `attention.IMPLS` (used when `attention_fn` is None,
        the default; Flax's default `nnx.dot_product_attention` can be passed explicitly).
      block_sizes: `(block_q, block_k)` of `impl="blockwise"`.
      fused_qkv: one `qkv` kernel `[in_features, H + 2G, d_k]`; self-attention only.
      v_head_dim: value width per head d_v (default d_k): value kernel `[in_kv, G, d_v]`,
        out kernel `[H, d_v, out_features]`.
      attention_type, attention_options: a member of `attention.family.ATTENTION_TYPES` and
        its hyper-parameters, as on the Linen layer; its parameters live under its name (e.g.
        `performer/random_features`), and the projections it does not use are not made (MLA
        makes its own q/k/v, LSH has no key).

    Decoding: `init_cache(input_shape)` (or `nnx.view(layer, decode=True, batch_size=...,
    max_length=...)`) allocates `cached_key [batch..., G, max_length, d_k]`,
    `cached_value [batch..., G, max_length, d_v]` and `cache_index [batch...]`. Each call
    with `decode=True` appends its L_new >= 1 tokens at each sequence's index and attends
    causally (`is_causal` is implied); `lengths [batch...]` says how many of them are real
    per sequence (a right-padded batch of prompts), and each index advances by its length.
    Positions past `max_length` are dropped, not checked, inside `jit`. Members that decode
    over this cache (entmax, span) keep its per-sequence positions; those with their own state
    (performer, mla) allocate it in `init_cache` / `set_view` (batch axes flattened) and decode
    in that mode only, every sequence at one position (no `lengths`).
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
        attention_fn: Callable[..., Array] | None = None,
        decode: bool | None = None,
        normalize_qk: bool = False,
        qkv_promote_dtype: Callable = dtypes.promote_dtype,
        out_promote_dtype: Callable = dtypes.promote_dtype,
        ln_promote_dtype: Callable = dtypes.promote_dtype,
        qkv_dot_general: Any = None,
        out_dot_general: Any = None,
        qkv_dot_general_cls: Any = None,
        out_dot_general_cls: Any = None,
        rngs: nnx.Rngs,
        keep_rngs: bool = True,
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
    ):
        owner = f"{type(self).__name__}."
        _check_features(owner, in_features=in_features, qkv_features=qkv_features,
                        out_features=out_features, in_kv_features=in_kv_features)
        self.num_heads = num_heads
        self.in_features = in_features
        self.qkv_features = qkv_features if qkv_features is not None else in_features
        self.out_features = out_features if out_features is not None else in_features
        self.in_kv_features = in_kv_features if in_kv_features is not None else in_features
        geometry = HeadGeometry.resolve(
            num_heads, num_kv_heads=num_kv_heads, v_head_dim=v_head_dim,
            features=self.qkv_features, features_name="qkv_features", owner=owner,
        )
        self.num_kv_heads = geometry.num_kv_heads
        self.head_dim = geometry.head_dim
        self.v_head_dim = geometry.v_head_dim
        _check_extras(owner, impl, block_sizes, fused_qkv, geometry, self.in_kv_features, in_features)
        if not 0.0 <= dropout_rate < 1.0:
            raise ValueError(f"{owner}dropout_rate = {dropout_rate!r}; expected a float in [0, 1)")

        self.dtype = dtype
        self.param_dtype = param_dtype
        self.broadcast_dropout = broadcast_dropout
        self.dropout_rate = dropout_rate
        self.deterministic = deterministic
        self.precision = precision
        self.use_bias = use_bias
        self.attention_fn = attention_fn
        self.decode = decode
        self.normalize_qk = normalize_qk
        self.qkv_promote_dtype = qkv_promote_dtype
        self.out_promote_dtype = out_promote_dtype
        self.ln_promote_dtype = ln_promote_dtype
        self.qkv_dot_general = qkv_dot_general
        self.out_dot_general = out_dot_general
        self.qkv_dot_general_cls = qkv_dot_general_cls
        self.out_dot_general_cls = out_dot_general_cls
        self.impl = impl
        self.block_sizes = block_sizes
        self.fused_qkv = fused_qkv
        options = family.check_options(attention_type, attention_options)  # checks the name too
        spec = family.member(attention_type)
        self.attention_type = attention_type
        self.attention_options = MappingProxyType(options)

        # created in Flax's order (query, key, value, norms, out, dropout stream): the same
        # rngs give the same parameters
        linear = functools.partial(
            nnx.LinearGeneral, dtype=dtype, param_dtype=param_dtype, kernel_init=kernel_init,
            bias_init=bias_init, use_bias=use_bias, precision=precision, promote_dtype=qkv_promote_dtype,
            dot_general=qkv_dot_general, dot_general_cls=qkv_dot_general_cls,
            kernel_metadata=kernel_metadata, bias_metadata=bias_metadata, rngs=rngs,
        )
        H, G, d_k, d_v = num_heads, self.num_kv_heads, self.head_dim, self.v_head_dim
        if spec is not None:  # what can be refused before a call is refused here
            family.check_call(
                type(self).__name__, attention_type, geometry, is_self=True, values_are_keys=True, causal=False,
                decode=bool(decode), attention_fn=attention_fn, dropout_rate=dropout_rate, sow_weights=False,
                fused_qkv=fused_qkv, normalize_qk=normalize_qk,
            )
        projects, shared_qk = spec is not None and spec.projects, spec is not None and spec.shared_qk
        if fused_qkv:
            self.qkv = linear(in_features, out_features=(H + 2 * G, d_k))
        elif not projects:
            self.query = linear(in_features, out_features=(H, d_k))
            if not shared_qk:
                self.key = linear(self.in_kv_features, out_features=(G, d_k))
            self.value = linear(self.in_kv_features, out_features=(G, d_v))
        if spec is not None:
            member = family.instantiate(
                attention_type, options, dtype=dtype, param_dtype=param_dtype, precision=precision, impl=impl,
                decode=False, kernel_init=kernel_init, use_bias=use_bias, num_heads=H, head_dim=d_k, v_head_dim=d_v,
            )
            wrapped = nnx.bridge.ToNNX(member)
            nnx.bridge.lazy_init(wrapped, *map(jnp.zeros, self._member_input_shapes(spec, (1,), 1)), rngs=rngs.params())
            setattr(self, attention_type, wrapped)
        self.query_ln: nnx.LayerNorm | None
        self.key_ln: nnx.LayerNorm | None
        if normalize_qk:
            norm = functools.partial(
                nnx.LayerNorm, d_k, use_bias=False, dtype=dtype, param_dtype=param_dtype,
                promote_dtype=ln_promote_dtype, rngs=rngs,
            )
            self.query_ln = norm(scale_metadata=query_ln_scale_metadata)
            self.key_ln = norm(scale_metadata=key_ln_scale_metadata)
        else:
            self.query_ln = nnx.data(None)
            self.key_ln = nnx.data(None)
        self.out = nnx.LinearGeneral(
            in_features=(H, d_v), out_features=self.out_features, axis=(-2, -1),
            kernel_init=out_kernel_init or kernel_init, bias_init=out_bias_init or bias_init,
            use_bias=use_bias, dtype=dtype, param_dtype=param_dtype, precision=precision,
            promote_dtype=out_promote_dtype, dot_general=out_dot_general,
            dot_general_cls=out_dot_general_cls, rngs=rngs,
            kernel_metadata=out_kernel_metadata or kernel_metadata,
            bias_metadata=out_bias_metadata or bias_metadata,
        )
        self.rngs = rngs.dropout.fork() if keep_rngs and dropout_rate > 0 else None
        self.cached_key: nnx.Cache | None = nnx.data(None)
        self.cached_value: nnx.Cache | None = nnx.data(None)
        self.cache_index: nnx.Cache | None = nnx.data(None)

    def __call__(
        self,
        inputs_q: Array,
        inputs_k: Array | None = None,
        inputs_v: Array | None = None,
        *,
        mask: Array | None = None,
        deterministic: bool | None = None,
        rngs: nnx.Rngs | nnx.RngStream | None = None,
        sow_weights: bool = False,
        decode: bool | None = None,
        is_causal: bool = False,
        out_sharding: Any = None,
        qkv_sharding: Any = None,
        input_positions: Array | None = None,
        head_mask: Array | None = None,
        lengths: Array | None = None,
    ) -> Array:
        """`inputs_q [batch..., Lq, in_features]` (and `inputs_k`/`inputs_v [batch..., Lk, in_kv_features]`) -> `[batch..., Lq, out_features]`.

        mask: broadcastable to `[batch..., H, Lq, Lk]`; bool or numeric (non-zero = attend).
        rngs: `nnx.Rngs` (its `dropout` stream) or an `RngStream`; default: the one kept at init.
        sow_weights: sow the weights `[batch..., H, Lq, Lk]` as `nnx.Intermediate` `attention_weights`.
        decode: use the cache (default: the constructor's `decode`, else False).
        is_causal: query i attends keys j <= i; implied by `decode`.
        input_positions: forwarded to `attention_fn` (as Flax does, e.g. for RoPE).
        head_mask: float, broadcastable to `[batch..., H]`; scales each head's output before W^O.
        lengths: with `decode`, the real new tokens per sequence, int `[batch...]` (default L_new).
        """
        if rngs is None:
            rngs = self.rngs
        elif isinstance(rngs, nnx.Rngs):
            rngs = rngs.dropout
        inputs_k, inputs_v = _resolve_inputs(inputs_q, inputs_k, inputs_v)
        if inputs_q.shape[-1] != self.in_features:
            raise ValueError(
                f"inputs_q has {inputs_q.shape[-1]} features (shape {inputs_q.shape}); "
                f"the layer expects in_features = {self.in_features}"
            )
        decode = bool(decode if decode is not None else self.decode)
        if self.attention_type != "softmax":
            if input_positions is not None:
                raise ValueError(f"input_positions is forwarded to attention_fn, which attention_type="
                                 f"{self.attention_type!r} does not take; leave it None")
            x = self._family_attention(inputs_q, inputs_k, inputs_v, mask, is_causal, decode, lengths, sow_weights,
                                       qkv_sharding)
            return self._output(x, head_mask, out_sharding)
        query, key, value = self._project(inputs_q, inputs_k, inputs_v, qkv_sharding)
        if self.normalize_qk:
            query, key = self.query_ln(query), self.key_ln(key)

        if decode:
            key, value, mask, _ = self._use_cache(query, key, value, mask, lengths)
            is_causal = False  # the cache mask is causal, at each sequence's offset
        elif lengths is not None:
            raise ValueError("lengths is a decode argument (the real new tokens per sequence); pass decode=True")

        dropout_rng = None
        if self.dropout_rate > 0.0:
            deterministic = first_from(
                deterministic, self.deterministic,
                error_msg="No `deterministic` argument was provided to MultiHeadAttention as either "
                "a __call__ argument or class attribute (it is needed when dropout_rate > 0).",
            )
            if not deterministic:
                if rngs is None:
                    raise ValueError(
                        "rngs must be provided to __call__ when dropout is on and the layer was "
                        "built with keep_rngs=False"
                    )
                dropout_rng = rngs()
        else:
            deterministic = True

        if self.attention_fn is not None:
            extra = {} if input_positions is None else {"input_positions": input_positions}
            x = self.attention_fn(
                query, key, value, mask=mask, dropout_rng=dropout_rng, dropout_rate=self.dropout_rate,
                broadcast_dropout=self.broadcast_dropout, deterministic=deterministic, dtype=self.dtype,
                precision=self.precision, module=self if sow_weights else None, is_causal=is_causal, **extra,
            )
        else:
            if input_positions is not None:
                raise ValueError(
                    "input_positions is forwarded to attention_fn, and attention_fn is None; "
                    "set an attention_fn that takes it (e.g. nnx.dot_product_attention_with_rope)"
                )
            x = self._attend(query, key, value, mask, is_causal, dropout_rng, deterministic, sow_weights)
        return self._output(x, head_mask, out_sharding)

    def _output(self, x, head_mask, sharding):
        """Heads `[batch..., Lq, H, d_v]`, gated by `head_mask`, through W^O."""
        if head_mask is not None:
            x = x * head_multiplier(head_mask, x.shape[:-3], self.num_heads, x.dtype)
        return self.out(x, out_sharding=sharding)

    def _family_attention(self, inputs_q, inputs_k, inputs_v, mask, is_causal, decode, lengths, sow_weights, sharding):
        """Heads `[batch..., Lq, H, d_v]` from the `attention_type` member, after checking it can serve this call."""
        name, causal = self.attention_type, is_causal or decode
        geometry = HeadGeometry(self.num_heads, self.num_kv_heads, self.head_dim, self.v_head_dim)
        spec = family.check_call(
            type(self).__name__, name, geometry, is_self=inputs_k is inputs_q and inputs_v is inputs_q,
            values_are_keys=inputs_v is inputs_k, causal=causal, decode=decode, attention_fn=self.attention_fn,
            dropout_rate=self.dropout_rate, sow_weights=sow_weights, fused_qkv=self.fused_qkv,
            normalize_qk=self.normalize_qk,
        )
        member = getattr(self, name)
        mutable = False
        if decode and spec.decode == "state":
            if not member.to_nnx__module.decode:
                raise ValueError(
                    f"decode=True with attention_type={name!r} needs the member's state: call "
                    "init_cache(input_shape) or nnx.view(layer, decode=True, batch_size=..., max_length=...) first"
                )
            if lengths is not None:
                raise ValueError(f"lengths with attention_type={name!r}: its decode state keeps one position for "
                                 "the whole batch; leave lengths None (per-sequence lengths need a KV-cache member)")
            mutable = ["cache"]
        elif not decode and spec.decode == "state" and member.to_nnx__module.decode:
            raise ValueError(f"decode=False with attention_type={name!r} after init_cache / set_view(decode=True): "
                             "the member is in decoding mode; run the full pass on a layer without the decode view")
        elif lengths is not None and not decode:
            raise ValueError("lengths is a decode argument (the real new tokens per sequence); pass decode=True")
        batch, Lq = inputs_q.shape[:-2], inputs_q.shape[-2]
        flat = lambda x: x.reshape(-1, *x.shape[len(batch):])
        if spec.projects:
            if not decode:
                mask = flatten_batch(as_bool_mask("mask", mask, (*batch, self.num_heads, Lq, inputs_k.shape[-2])), batch)
            x = member(flat(inputs_q), flat(inputs_k), mask=mask, is_causal=causal, mutable=mutable)
        else:
            query, key, value = self._project(inputs_q, inputs_k, inputs_v, sharding, shared_qk=spec.shared_qk)
            if self.normalize_qk:
                query, key = self.query_ln(query), self.key_ln(key)
            offset = 0
            if decode and spec.decode == "kv_cache":
                key, value, mask, offset = self._use_cache(query, key, value, mask, lengths)
                offset = offset.reshape(-1)  # each sequence's first new position
            mask = flatten_batch(as_bool_mask("mask", mask, (*batch, self.num_heads, Lq, key.shape[-3])), batch)
            x = member(flat(query), flat(key), flat(value), mask=mask, is_causal=causal, query_offset=offset,
                       mutable=mutable)  # ToNNX keeps the updated state and returns the output
        return x.reshape(*batch, *x.shape[1:])

    def _member_input_shapes(self, spec, batch, length):
        """Shapes `[B, length, ...]` of the member's call inputs (B = prod(batch)): what its Linen init needs."""
        B, H, G = math.prod(batch), self.num_heads, self.num_kv_heads
        if spec.projects:
            return (B, length, self.in_features), (B, length, self.in_kv_features)
        return (B, length, H, self.head_dim), (B, length, G, self.head_dim), (B, length, G, self.v_head_dim)

    def _state_member(self):
        """The wrapped member if it decodes with its own state (performer, mla), else None."""
        spec = family.member(self.attention_type)
        return getattr(self, self.attention_type) if spec is not None and spec.decode == "state" else None

    def _project(self, inputs_q, inputs_k, inputs_v, sharding, shared_qk=False):
        """q `[batch..., Lq, H, d_k]`, k `[batch..., Lk, G, d_k]` (q when `shared_qk`), v `[batch..., Lk, G, d_v]`."""
        if self.fused_qkv:
            if not (inputs_k is inputs_q and inputs_v is inputs_q):
                raise ValueError(
                    "fused_qkv=True projects q, k and v from one input; it needs self-attention "
                    "(inputs_k and inputs_v None or the same array as inputs_q)"
                )
            qkv = self.qkv(inputs_q, out_sharding=sharding)
            H, G = self.num_heads, self.num_kv_heads
            return jnp.split(qkv, [H, H + G], axis=-2)
        query = self.query(inputs_q, out_sharding=sharding)
        key = query if shared_qk else self.key(inputs_k, out_sharding=sharding)
        return query, key, self.value(inputs_v, out_sharding=sharding)

    def _attend(self, query, key, value, mask, is_causal, dropout_rng, deterministic, sow_weights):
        impl = "vmap" if sow_weights and self.impl == "auto" else self.impl
        blocks = {} if self.block_sizes is None else dict(zip(("block_q", "block_k"), self.block_sizes))
        x, weights = attend(
            query, key, value, mask=mask, is_causal=is_causal, impl=impl, **blocks,
            dropout_rate=self.dropout_rate, dropout_rng=dropout_rng, deterministic=deterministic,
            broadcast_dropout=self.broadcast_dropout, dtype=self.dtype, precision=self.precision,
        )
        if sow_weights:
            if weights is None:
                raise ValueError(
                    f"sow_weights=True needs the attention weights, which impl={impl!r} does not "
                    "expose; use impl='vmap', 'einsum' or 'auto'"
                )
            self.sow(nnx.Intermediate, "attention_weights", weights)
        return x

    def _use_cache(self, query, key, value, mask, lengths):
        """Write k/v at each sequence's index; return the whole cache (caller layout), the mask and the old index."""
        if self.cached_key is None or self.cached_value is None or self.cache_index is None:
            raise ValueError(
                "decode=True needs the cache: call init_cache(input_shape) or "
                "nnx.view(layer, decode=True, batch_size=..., max_length=...) first"
            )
        *batch, G, max_length, _ = self.cached_key.shape
        batch, new_length = tuple(batch), query.shape[-3]
        if tuple(key.shape[:-3]) != batch or key.shape[-2] != G or new_length > max_length:
            raise ValueError(
                f"decode: the cache holds {max_length} positions for batch {batch} and {G} KV "
                f"heads, got queries {query.shape} and keys {key.shape}"
            )
        index = self.cache_index[...]
        if lengths is None:
            advance = jnp.asarray(new_length, index.dtype)
        else:
            lengths = jnp.asarray(lengths)
            if lengths.shape != batch or not jnp.issubdtype(lengths.dtype, jnp.integer):
                raise ValueError(
                    f"lengths must be ints of shape {batch} (the real new tokens per sequence), "
                    f"got {lengths.dtype} {lengths.shape}"
                )
            advance = lengths.astype(index.dtype)
        mask = as_bool_mask("mask", mask, (*batch, self.num_heads, new_length, max_length))
        updated = (cache.write(self.cached_key[...], key, index), cache.write(self.cached_value[...], value, index))
        # one materialised update per cache (read by attention, stored): lets XLA update in place
        self.cached_key[...], self.cached_value[...] = lax.optimization_barrier(updated)
        self.cache_index[...] = index + advance
        to_caller = lambda x: jnp.swapaxes(x, -3, -2)
        mask = and_masks(mask, cache.causal_mask(index, new_length, max_length))
        return to_caller(self.cached_key[...]), to_caller(self.cached_value[...]), mask, index

    def init_cache(self, input_shape: tuple[int, ...], dtype: Any = jnp.float32):
        """Allocate the decode cache for inputs `[batch..., max_length, features]` (as Flax's)."""
        if len(input_shape) < 2:
            raise ValueError(
                f"init_cache: input_shape must be [batch..., max_length, features], got {tuple(input_shape)}"
            )
        self._allocate(tuple(input_shape[:-2]), input_shape[-2], dtype)

    def set_view(
        self,
        deterministic: bool | None = None,
        decode: bool | None = None,
        batch_size: int | tuple[int, ...] | None = None,
        max_length: int | None = None,
    ):
        """Used by `nnx.view`: set modes; with `decode=True`, allocate the cache if it is missing or sized here."""
        if deterministic is not None:
            self.deterministic = deterministic
        if decode is not None:
            self.decode = decode
            if decode and (not self._has_cache() or batch_size is not None or max_length is not None):
                if batch_size is None or max_length is None:
                    raise ValueError(
                        f"set_view(decode=True) allocates the cache and needs batch_size and "
                        f"max_length, got batch_size={batch_size!r}, max_length={max_length!r}"
                    )
                batch = (batch_size,) if isinstance(batch_size, int) else tuple(batch_size)
                self._allocate(batch, max_length, self.dtype)

    def _has_cache(self):
        member = self._state_member()
        return member.to_nnx__module.decode if member is not None else self.cached_key is not None

    def _allocate(self, batch, max_length, dtype):
        if not all(isinstance(b, int) and b > 0 for b in batch) or not (isinstance(max_length, int) and max_length > 0):
            raise ValueError(
                f"the cache needs positive int batch sizes and max_length, got batch {batch}, "
                f"max_length {max_length!r}"
            )
        member = self._state_member()
        if member is not None:  # the member's own state, shaped by its Linen init (nothing computed)
            module = member.to_nnx__module.clone(decode=True)
            inputs = [jax.ShapeDtypeStruct(shape, jnp.float32)
                      for shape in self._member_input_shapes(family.member(self.attention_type), batch, max_length)]
            state = jax.eval_shape(lambda *x: module.init(jax.random.key(0), *x)["cache"], *inputs)
            for name, leaf in state.items():
                setattr(member, name, nnx.Cache(jnp.zeros(leaf.shape, leaf.dtype)))
            member.to_nnx__module = module
            return
        G = self.num_kv_heads
        self.cached_key = nnx.Cache(jnp.zeros((*batch, G, max_length, self.head_dim), dtype))
        self.cached_value = nnx.Cache(jnp.zeros((*batch, G, max_length, self.v_head_dim), dtype))
        self.cache_index = nnx.Cache(jnp.zeros(batch, jnp.int32))


def to_linen_params(layer: nnx.Module) -> dict:
    """The layer's `nnx.Param`s as a Linen `params` tree (`{"query": {"kernel": ...}, ...}`).

    Flax's Linen and NNX attention layers and ours share parameter names and shapes, so this
    tree is what `attention.MultiHeadAttention` / `flax.linen.MultiHeadDotProductAttention`
    take as `{"params": tree}` for the same configuration.
    """
    return nnx.to_pure_dict(nnx.state(layer, nnx.Param))


def load_linen_params(layer: nnx.Module, params: Mapping[str, Any]) -> None:
    """Set `layer`'s `nnx.Param`s from a Linen `params` tree (the `"params"` collection, not the variables).

    Raises a ValueError naming the first parameter path that is missing, unexpected or of
    another shape.
    """
    state = nnx.state(layer, nnx.Param)
    ours = _flat(nnx.to_pure_dict(state))
    theirs = _flat(params)
    for path in sorted(set(ours) | set(theirs)):
        name = "/".join(path)
        if path not in theirs:
            raise ValueError(f"params: {name} is missing (the layer has it, shape {ours[path].shape})")
        if path not in ours:
            raise ValueError(f"params: {name} is not a parameter of this layer ({type(layer).__name__})")
        if tuple(jnp.shape(theirs[path])) != tuple(ours[path].shape):
            raise ValueError(
                f"params: {name} has shape {tuple(jnp.shape(theirs[path]))}; the layer expects {tuple(ours[path].shape)}"
            )
    nnx.replace_by_pure_dict(state, _unflatten({p: jnp.asarray(v) for p, v in theirs.items()}))
    nnx.update(layer, state)


def _flat(tree, prefix=()):
    if not isinstance(tree, Mapping):
        return {prefix: tree}
    return {path: leaf for key, sub in tree.items() for path, leaf in _flat(sub, (*prefix, str(key))).items()}


def _unflatten(flat):
    tree: dict = {}
    for path, leaf in flat.items():
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = leaf
    return tree


def _resolve_inputs(inputs_q, inputs_k, inputs_v):
    """Flax's rules: k defaults to q, v to k."""
    if inputs_k is None:
        if inputs_v is not None:
            raise ValueError(
                "inputs_k cannot be None if inputs_v is not None; to use one array for both, "
                "pass it as inputs_k and leave inputs_v None"
            )
        inputs_k = inputs_q
    return inputs_k, inputs_k if inputs_v is None else inputs_v


def _check_features(owner, **features):
    for name, value in features.items():
        required = name == "in_features"
        ok = (value is None and not required) or (isinstance(value, int) and not isinstance(value, bool) and value > 0)
        if not ok:
            expected = "a positive int" if required else "None or a positive int"
            raise ValueError(f"{owner}{name} = {value!r}; expected {expected}")


def _check_extras(owner, impl, block_sizes, fused_qkv, geometry, in_kv_features, in_features):
    if impl not in IMPLS:
        raise ValueError(f"{owner}impl = {impl!r}; expected one of {IMPLS}")
    if block_sizes is not None and not (
        len(block_sizes) == 2 and all(isinstance(b, int) and b > 0 for b in block_sizes)
    ):
        raise ValueError(f"{owner}block_sizes = {block_sizes!r}; expected None or (block_q, block_k), positive ints")
    if fused_qkv and geometry.v_head_dim != geometry.head_dim:
        raise ValueError(
            f"{owner}v_head_dim = {geometry.v_head_dim}; fused_qkv=True needs v_head_dim None or "
            f"head_dim ({geometry.head_dim}): q, k and v share one kernel"
        )
    if fused_qkv and in_kv_features != in_features:
        raise ValueError(
            f"{owner}in_kv_features = {in_kv_features}; fused_qkv=True is self-attention and "
            f"needs it None or in_features ({in_features})"
        )
