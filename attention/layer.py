"""`MultiHeadAttention`: a Flax Linen drop-in for `nn.MultiHeadDotProductAttention` with GQA/MQA.

With `num_kv_heads == num_heads`, `v_head_dim=None` and `fused_qkv=False` the parameter
tree is Flax's (`query`/`key`/`value` kernels `[D, H, Dk]`, `out` kernel `[H, Dk, Dout]`), so
Flax checkpoints load unchanged. `MultiHeadDotProductAttention` is the same class under
Flax's class name, so that an unnamed submodule keeps Flax's automatic parameter path
(`MultiHeadDotProductAttention_0`) when a model swaps the import.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
from jax import lax

from attention import beams, family
from attention.core import attend
from attention.geometry import HeadGeometry
from attention.grouped import flatten_batch
from attention.masks import and_masks, as_bool_mask, head_multiplier, structure_mask

Array = Any


class MultiHeadAttention(nn.Module):
    """Multi-head attention with `num_kv_heads` key/value heads (MHA, GQA or MQA).

    Attributes are Flax's `MultiHeadDotProductAttention` attributes plus:
      num_kv_heads: key/value heads G (default `num_heads`); must divide `num_heads`.
      v_head_dim: value width per head d_v (default d_k = qkv_features / num_heads): value
        kernel `[D, G, d_v]`, out kernel `[H, d_v, Dout]`. impl 'xla'/'cudnn' need d_v == d_k.
      impl: attention computation, one of `attention.IMPLS` (ignored if `attention_fn` is set).
        With `sow_weights=True`, "auto" runs "vmap" (the weights are needed).
      block_sizes: `(block_q, block_k)` of `impl="blockwise"` (default: the library's).
      fused_qkv: project q, k and v with one `[D, H + 2G, Dk]` GEMM (`qkv` parameter);
        self-attention only.
      out_kernel_init: init of W^O, e.g. scaled down with depth (GPT-2 style).
      cache_cross_kv: keep the projected keys/values in the `cache` collection and reuse them on
        later calls, skipping the key/value projections: cross-attention decoding, where the
        source does not change between steps. The first `apply` with a mutable `cache` that
        holds none stores them (not `init`, whose inputs are placeholders); later calls'
        `inputs_k`/`inputs_v` are then not read.
      attention_type: "softmax" (this layer's exact attention, every `impl`) or a member of
        `attention.family.ATTENTION_TYPES`, whose parameters live under its name; the layer
        keeps its projections and W^O (MLA makes its own q/k/v). `attention_options`: the
        member's hyper-parameters (`attention.family.options_of`).

    `attention_fn`, when given, is called Flax-style (`attention_fn(q, k, v, mask=...,
    ...)`) in place of `impl`; `qk_attn_weights_einsum_cls` and
    `attn_weights_value_einsum_cls` are forwarded to it. Softmax always runs in float32
    in the built-in paths; there `force_fp32_for_softmax` only makes the sown weights float32,
    as Flax's are (they are the compute-dtype weights that multiplied V, upcast).

    Decoding (`decode=True`): `init` with the full-length input sizes the cache; each
    later call appends its L_new >= 1 keys/values at `cache_index` and attends causally:
    a query at absolute position p sees cached positions <= p (so `is_causal` is implied).
    The cache holds only the G KV heads, laid out `[batch..., G, max_length, D]` (the layout
    attention computes in, `attention.grouped`); jit the step with the cache donated and XLA
    writes the new entries into the same buffer.
    Writing past `max_length` is not checked inside `jit` (positions clamp, as in Flax).
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
    attention_fn: Callable[..., Array] | None = None
    decode: bool = False
    normalize_qk: bool = False
    force_fp32_for_softmax: bool = False
    qkv_dot_general: Any = None
    out_dot_general: Any = None
    qkv_dot_general_cls: Any = None
    out_dot_general_cls: Any = None
    qk_attn_weights_einsum_cls: Callable[..., Callable[..., Array]] | None = None
    attn_weights_value_einsum_cls: Callable[..., Callable[..., Array]] | None = None
    num_kv_heads: int | None = None
    impl: str = "vmap"
    fused_qkv: bool = False
    block_sizes: tuple[int, int] | None = None
    v_head_dim: int | None = None
    cache_cross_kv: bool = False
    attention_type: str = "softmax"
    attention_options: Mapping[str, Any] | None = None

    @nn.compact
    def __call__(
        self,
        inputs_q: Array,
        inputs_k: Array | None = None,
        inputs_v: Array | None = None,
        *,
        inputs_kv: Array | None = None,
        mask: Array | None = None,
        deterministic: bool | None = None,
        dropout_rng: Array | None = None,
        sow_weights: bool = False,
        head_mask: Array | None = None,
        is_causal: bool = False,
    ) -> Array:
        """Self-attention on `inputs_q [batch..., Lq, D]`, or cross-attention to `inputs_k`/`inputs_v`.

        mask: broadcastable to `[batch..., H, Lq, Lk]`: bool (True = attend) or, as Flax's
          float masks, numeric (non-zero = attend; see `attention.masks`).
        head_mask: float, broadcastable to `[batch..., H]`; scales each head's output before W^O.
        sow_weights: sow the weights `[batch..., H, Lq, Lk]` as `intermediates/attention_weights`.
        Returns `[batch..., Lq, out_features or D]`.
        """
        inputs_k, inputs_v = _resolve_inputs(inputs_q, inputs_k, inputs_v, inputs_kv)
        geometry = self._check_config(inputs_q, inputs_k is inputs_q and inputs_v is inputs_q)
        options = family.check_options(self.attention_type, self.attention_options)  # checks the name too
        spec = family.member(self.attention_type)
        if spec is not None:
            x = self._family_attention(spec, options, geometry, inputs_q, inputs_k, inputs_v, mask, is_causal,
                                       sow_weights)
            return self._output(x, head_mask, inputs_q)
        query, key, value = self._project(inputs_q, inputs_k, inputs_v, geometry)
        if self.normalize_qk:
            query, key = self._normalize_qk(query, key)

        if self.dropout_rate > 0.0:
            deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
            if not deterministic and dropout_rng is None:
                dropout_rng = self.make_rng("dropout")
        else:
            deterministic = True

        beam_rows = None
        if self.decode:
            in_place = self.attention_fn is None and not sow_weights and deterministic
            key, value, mask, cached, beam_rows = self._use_cache(query, key, value, mask, beams_in_place=in_place)
            if cached:  # the cache mask already makes the call causal, at the right offset
                is_causal = False

        if beam_rows is not None:
            x = beams.history_attention(query, key, value, beam_rows, mask, dtype=self.dtype, precision=self.precision)
        elif self.attention_fn is not None:
            x = self._call_attention_fn(
                query, key, value, mask, is_causal, deterministic, dropout_rng, sow_weights
            )
        else:
            impl = "vmap" if sow_weights and self.impl == "auto" else self.impl
            blocks = {} if self.block_sizes is None else dict(zip(("block_q", "block_k"), self.block_sizes))
            x, weights = attend(
                query, key, value, mask=mask, is_causal=is_causal, impl=impl, **blocks,
                dropout_rate=self.dropout_rate, dropout_rng=dropout_rng,
                deterministic=deterministic, broadcast_dropout=self.broadcast_dropout,
                dtype=self.dtype, precision=self.precision,
            )
            if sow_weights:
                if weights is None:
                    raise ValueError(
                        f"sow_weights=True needs the attention weights, which impl={impl!r} "
                        "does not expose; use impl='vmap', 'einsum' or 'auto'"
                    )
                # Flax sows float32 weights under force_fp32_for_softmax
                self.sow("intermediates", "attention_weights",
                         weights.astype(jnp.float32) if self.force_fp32_for_softmax else weights)
        return self._output(x, head_mask, inputs_q)

    def _normalize_qk(self, query, key):
        layer_norm = functools.partial(nn.LayerNorm, use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype)
        return layer_norm(name="query_ln")(query), layer_norm(name="key_ln")(key)

    def _output(self, x, head_mask, inputs_q):
        """Heads `[batch..., Lq, H, d_v]`, gated by `head_mask`, through W^O."""
        if head_mask is not None:
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

    def _family_attention(self, spec, options, geometry, inputs_q, inputs_k, inputs_v, mask, is_causal, sow_weights):
        """Heads `[batch..., Lq, H, d_v]` from the `attention_type` member, after checking it can serve this call."""
        name = self.attention_type
        causal = is_causal or self.decode
        family.check_call(
            type(self).__name__, name, geometry, is_self=inputs_k is inputs_q and inputs_v is inputs_q,
            values_are_keys=inputs_v is inputs_k, causal=causal, decode=self.decode,
            attention_fn=self.attention_fn, dropout_rate=self.dropout_rate, sow_weights=sow_weights,
            fused_qkv=self.fused_qkv, normalize_qk=self.normalize_qk,
        )
        module = family.instantiate(
            name, options, dtype=self.dtype, param_dtype=self.param_dtype, precision=self.precision,
            impl=self.impl, decode=self.decode, kernel_init=self.kernel_init, use_bias=self.use_bias,
            num_heads=geometry.num_heads, head_dim=geometry.head_dim, v_head_dim=geometry.v_head_dim,
        )
        batch, Lq = inputs_q.shape[:-2], inputs_q.shape[-2]
        flat = lambda x: x.reshape(-1, *x.shape[len(batch):])
        if spec.projects:
            Lk = inputs_k.shape[-2]
            if not self.decode:
                mask = flatten_batch(as_bool_mask("mask", mask, (*batch, self.num_heads, Lq, Lk)), batch)
            x = module(flat(inputs_q), flat(inputs_k), mask=mask, is_causal=causal)
            return x.reshape(*batch, *x.shape[1:])
        query, key, value = self._project(inputs_q, inputs_k, inputs_v, geometry, shared_qk=spec.shared_qk)
        if self.normalize_qk:
            query, key = self._normalize_qk(query, key)
        offset, beams_kwarg = 0, {}
        if self.decode and spec.decode == "kv_cache":
            key, value, mask, cached, beam_rows = self._use_cache(query, key, value, mask,
                                                                   beams_in_place=spec.beams_in_place)
            if cached:  # the first new query's absolute position
                offset = self.get_variable("cache", "cache_index") - Lq
            if beam_rows is not None:
                beams_kwarg = {"beam_rows": beam_rows}
        mask = flatten_batch(as_bool_mask("mask", mask, (*batch, self.num_heads, Lq, key.shape[-3])), batch)
        x = module(flat(query), flat(key), flat(value), mask=mask, is_causal=causal, query_offset=offset, **beams_kwarg)
        return x.reshape(*batch, *x.shape[1:])

    def _check_config(self, inputs_q, is_self_attention):
        """Validate the attributes; return the resolved `HeadGeometry`."""
        owner = f"{type(self).__name__}."
        geometry = HeadGeometry.resolve(
            self.num_heads, num_kv_heads=self.num_kv_heads, v_head_dim=self.v_head_dim,
            features=self.qkv_features or inputs_q.shape[-1], features_name="qkv_features", owner=owner,
        )
        if self.fused_qkv and geometry.v_head_dim != geometry.head_dim:
            raise ValueError(
                f"{owner}v_head_dim = {self.v_head_dim}; fused_qkv=True needs v_head_dim None "
                f"or head_dim ({geometry.head_dim}): q, k and v share one kernel"
            )
        if self.fused_qkv and not is_self_attention:
            raise ValueError(
                "fused_qkv=True projects q, k and v from one input; it needs self-attention "
                "(inputs_k and inputs_v None or the same array as inputs_q)"
            )
        if self.cache_cross_kv and self.decode:
            raise ValueError(
                f"{owner}cache_cross_kv = True with decode = True; expected one of them: cache_cross_kv keeps "
                "a source's keys/values (cross-attention), decode appends to a growing self-attention cache"
            )
        einsum_cls = self.qk_attn_weights_einsum_cls or self.attn_weights_value_einsum_cls
        if einsum_cls is not None and self.attention_fn is None:
            raise ValueError(
                "qk_attn_weights_einsum_cls / attn_weights_value_einsum_cls are forwarded to "
                "attention_fn; set attention_fn (e.g. flax.linen.dot_product_attention) too"
            )
        return geometry

    def _project(self, inputs_q, inputs_k, inputs_v, geometry, shared_qk=False):
        """q [batch..., Lq, H, Dk], k [batch..., Lk, G, Dk], v [batch..., Lk, G, Dv]; k is q when `shared_qk`."""
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
            qkv = dense(features=(H + 2 * G, d_k), name="qkv")(inputs_q)
            return jnp.split(qkv, [H, H + G], axis=-2)
        query = dense(features=(H, d_k), name="query")(inputs_q)
        project_kv = lambda: (  # noqa: E731
            query if shared_qk else dense(features=(G, d_k), name="key")(inputs_k),
            dense(features=(G, geometry.v_head_dim), name="value")(inputs_v),
        )
        return query, *(self._cross_kv(project_kv) if self.cache_cross_kv else project_kv())

    def _cross_kv(self, project_kv):
        """(key, value) read from the cache, or projected, and stored if the cache is being filled (`cache_cross_kv`).

        Stored head-first, `[batch..., G, Ls, D]`, the layout the attention reads (as `_use_cache`):
        the transpose back to the caller's layout and the kernel's own then cancel, so no step
        transposes the source's keys and values again.
        """
        to_caller = lambda x: jnp.swapaxes(x, -3, -2)  # noqa: E731
        if self.has_variable("cache", "cross_key"):
            return to_caller(self.get_variable("cache", "cross_key")), to_caller(self.get_variable("cache", "cross_value"))
        key, value = project_kv()
        if self.is_mutable_collection("cache") and not self.is_initializing():
            self.put_variable("cache", "cross_key", to_caller(key))
            self.put_variable("cache", "cross_value", to_caller(value))
        return key, value

    def _use_cache(self, query, key, value, mask, beams_in_place=False):
        """Append key/value to the cache; return (keys, values, mask, cached, beam_rows).

        The cache is `[batch..., G, max_length, D]`, the internal layout; the keys and values
        return to the caller's `[batch..., L, G, D]` by a transpose that `attend` undoes, and
        XLA folds the pair away. Under beam search (a `beam_rows` table beside the cache,
        `attention.beams`) the rows hold the beams' histories spread out: returned as they are
        with the table if `beams_in_place` (for `beams.history_attention`), else gathered into
        each beam's own keys/values and the table None.
        """
        key_hf, value_hf = jnp.swapaxes(key, -3, -2), jnp.swapaxes(value, -3, -2)
        is_initialized = self.has_variable("cache", "cached_key")
        # in the compute dtype: a projection's dot_general may return a wider type
        cache_dtype = self.dtype or key_hf.dtype
        cached_key = self.variable("cache", "cached_key", jnp.zeros, key_hf.shape, cache_dtype)
        cached_value = self.variable("cache", "cached_value", jnp.zeros, value_hf.shape, cache_dtype)
        cache_index = self.variable("cache", "cache_index", lambda: jnp.array(0, dtype=jnp.int32))
        if not is_initialized:  # init: size the cache, attend over the inputs as usual
            return key, value, mask, False, None
        *batch, G, max_length, _ = cached_key.value.shape
        new_length = query.shape[-3]
        if tuple(key_hf.shape[:-2]) != (*batch, G) or new_length > max_length:
            raise ValueError(
                f"decode: the cache holds {max_length} positions for batch {tuple(batch)} and "
                f"{G} KV heads, got queries {query.shape} and keys {key.shape}"
            )
        mask = as_bool_mask("mask", mask, (*batch, self.num_heads, new_length, max_length))
        cur = cache_index.value
        zero = jnp.zeros((), cur.dtype)  # all indices in one dtype, also under jax_enable_x64
        start = (zero,) * (len(batch) + 1) + (cur, zero)
        updated = (
            lax.dynamic_update_slice(cached_key.value, key_hf.astype(cached_key.value.dtype), start),
            lax.dynamic_update_slice(cached_value.value, value_hf.astype(cached_value.value.dtype), start),
        )
        # One materialised update per cache, read by the attention and returned: without the
        # barrier XLA may fuse the update into each consumer and copy the (donated) cache.
        cached_key.value, cached_value.value = lax.optimization_barrier(updated)
        cache_index.value = cur + new_length
        query_positions = cur + jnp.arange(new_length)
        cache_mask = jnp.arange(max_length)[None, :] <= query_positions[:, None]
        mask = and_masks(mask, cache_mask)
        to_caller = lambda x: jnp.swapaxes(x, -3, -2)
        key, value = to_caller(cached_key.value), to_caller(cached_value.value)
        if not self.has_variable("cache", beams.ROWS):
            return key, value, mask, True, None
        beam_rows = self.get_variable("cache", beams.ROWS)
        if (beam_rows.ndim != 3 or len(batch) != 1 or beam_rows.shape[0] * beam_rows.shape[1] != batch[0]
                or beam_rows.shape[2] != max_length):
            raise ValueError(f"cache beam_rows must be [sources, beams, {max_length}] int with sources * beams = the "
                             f"batch {tuple(batch)}, got shape {beam_rows.shape}")
        # tells beam search this cache was read through the table (attention.beams)
        self.put_variable("cache", beams.ROWS_READ, jnp.zeros((), bool))
        if beams_in_place:
            return key, value, mask, True, beam_rows
        return beams.gather_history(key, beam_rows), beams.gather_history(value, beam_rows), mask, True, None

    def _call_attention_fn(
        self, query, key, value, mask, is_causal, deterministic, dropout_rng, sow_weights
    ):
        """Call a user `attention_fn` the way Flax does (unknown kwargs are filtered out)."""
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
        accepted = inspect.signature(self.attention_fn).parameters
        kwargs = {k: v for k, v in kwargs.items() if k in accepted}
        if sow_weights:
            kwargs["module"] = self
        return self.attention_fn(query, key, value, **kwargs)


class MultiHeadDotProductAttention(MultiHeadAttention):
    """`MultiHeadAttention` under Flax's class name: unnamed instances get Flax's parameter paths."""


class SelfAttention(MultiHeadDotProductAttention):
    """Flax's `nn.SelfAttention`: self-attention with `mask` as the second positional argument.

    Deprecated in Flax, and it warns as Flax's does; use `MultiHeadDotProductAttention(x)`.
    """

    @nn.compact
    def __call__(  # type: ignore[override]
        self,
        inputs_q: Array,
        mask: Array | None = None,
        deterministic: bool | None = None,
        dropout_rng: Array | None = None,
        sow_weights: bool = False,
        **kwargs,
    ) -> Array:
        """`inputs_q [batch..., L, D]` -> `[batch..., L, out_features or D]`; kwargs: head_mask, is_causal."""
        warnings.warn(
            "SelfAttention will be deprecated soon. Use "
            "`MultiHeadDotProductAttention.__call__(inputs_q)` instead. "
            "See https://github.com/google/flax/discussions/3389 for more information.",
            DeprecationWarning,
            stacklevel=2,
        )
        return super().__call__(
            inputs_q, mask=mask, deterministic=deterministic, dropout_rng=dropout_rng,
            sow_weights=sow_weights, **kwargs,
        )


def _resolve_inputs(inputs_q, inputs_k, inputs_v, inputs_kv):
    """Flax's rules, errors and warnings: k defaults to q, v to k; `inputs_kv` (deprecated) sets both."""
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
            stacklevel=3,
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
            stacklevel=3,
        )
    return inputs_k, inputs_v
