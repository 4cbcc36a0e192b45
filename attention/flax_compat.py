"""Flax-compatibility shims of the two layer faces: Flax's input rules and warnings, its `attention_fn`
call, and the NNX layer's parameters as a Linen tree (and back).

Nothing here computes attention; the faces (`attention.layer`, `attention.nnx`) call these where
Flax's conventions differ from the library's own, starting with one check of each call
(`linen_call`, `nnx_call`: Flax's input rules, the settings, the dropout flags) that returns the
`attention.multihead.Call` the rest of the call reads.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx, traverse_util
from flax.nnx.module import first_from

from attention import family
from attention import multihead as mh
from attention.checks import require
from attention.geometry import HeadGeometry
from attention.grouped import relayout
from attention.masks import and_masks, structure_mask


def linen_call(layer, inputs_q, inputs_k, inputs_v, inputs_kv, deterministic, dropout_rng, lengths) -> mh.Call:
    """The Linen layer's call checked: Flax's input rules, the attributes and `lengths`, then the dropout flags."""
    inputs_k, inputs_v = resolve_linen_inputs(inputs_q, inputs_k, inputs_v, inputs_kv)
    owner = f"{type(layer).__name__}."
    geometry = HeadGeometry.resolve(
        layer.num_heads,
        num_kv_heads=layer.num_kv_heads,
        v_head_dim=layer.v_head_dim,
        features=layer.qkv_features or inputs_q.shape[-1],
        features_name="qkv_features",
        owner=owner,
    )
    blocks = mh.check_settings(
        owner,
        geometry,
        impl=layer.impl,
        block_sizes=layer.block_sizes,
        fused_qkv=layer.fused_qkv,
        dropout_rate=layer.dropout_rate,
    )
    mh.check_fused_inputs(layer.fused_qkv, inputs_k is inputs_q and inputs_v is inputs_q)
    check_einsum_cls(layer)
    mh.check_lengths(lengths, layer.decode)
    options = family.check_options(layer.attention_type, layer.attention_options)  # checks the name too
    if layer.attention_type == "softmax":  # a member refuses dropout itself
        deterministic, dropout_rng = linen_dropout(layer, deterministic, dropout_rng)
    kv_layout = projected_kv_layout(layer)
    decode = mh.steps_decode_state(layer.decode, layer.cache_cross_kv)
    return mh.Call(
        (inputs_q, inputs_k, inputs_v), geometry, blocks, options, deterministic, dropout_rng, kv_layout, decode
    )


def nnx_call(layer, inputs_q, inputs_k, inputs_v, *, decode, lengths, input_positions, deterministic, rngs) -> mh.Call:
    """The NNX layer's call checked: Flax's input rules, the call's arguments, then (softmax) the dropout flags."""
    inputs_k, inputs_v = resolve_nnx_inputs(inputs_q, inputs_k, inputs_v)
    check_nnx_call(layer, inputs_q, decode, lengths, input_positions)
    if layer.attention_type == "softmax":  # a member refuses dropout itself
        deterministic, dropout_rng = nnx_dropout(layer, deterministic, rngs)
    else:
        dropout_rng = None
    inputs = (inputs_q, inputs_k, inputs_v)
    return mh.Call(
        inputs,
        layer.geometry,
        layer.blocks,
        dict(layer.attention_options),
        deterministic,
        dropout_rng,
        projected_kv_layout(layer),
        mh.steps_decode_state(decode, layer.cache_cross_kv),
    )


def projected_kv_layout(layer) -> str:
    """The layout of a face's projected keys/values: a kept cross source's (`cache_cross_kv`, `mh.cross_kv`),
    else Flax's. A fused projection is self-attention: it keeps no source."""
    return mh.CROSS_LAYOUT if layer.cache_cross_kv and not layer.fused_qkv else "BTNH"


def flax_layout(kv_layout: str, key: jax.Array, value: jax.Array) -> tuple[jax.Array, jax.Array]:
    """key and value from `kv_layout` to Flax's `[batch..., Lk, G, D]`, as a user's `attention_fn` takes them."""
    return relayout(key, kv_layout, "BTNH"), relayout(value, kv_layout, "BTNH")


def call_attention_fn(layer, query, key, value, mask, is_causal, deterministic, dropout_rng, sow_weights):
    """Call a Linen layer's user `attention_fn` the way Flax does (unknown keyword arguments are filtered out).

    Flax Linen's `attention_fn` takes no `is_causal`: causality is ANDed into the mask.
    """
    mask = and_masks(mask, structure_mask(query.shape[-3], key.shape[-3], is_causal, None))
    kwargs = dict(
        mask=mask,
        dropout_rng=dropout_rng,
        dropout_rate=layer.dropout_rate,
        broadcast_dropout=layer.broadcast_dropout,
        deterministic=deterministic,
        dtype=layer.dtype,
        precision=layer.precision,
        force_fp32_for_softmax=layer.force_fp32_for_softmax,
        qk_attn_weights_einsum=layer.qk_attn_weights_einsum_cls and layer.qk_attn_weights_einsum_cls(),
        attn_weights_value_einsum=layer.attn_weights_value_einsum_cls and layer.attn_weights_value_einsum_cls(),
    )
    accepted = inspect.signature(layer.attention_fn).parameters
    kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    if sow_weights:
        kwargs["module"] = layer
    return layer.attention_fn(query, key, value, **kwargs)


def check_einsum_cls(layer) -> None:
    """The Linen layer's einsum classes are forwarded to `attention_fn`, as Flax's: they need one."""
    if (layer.qk_attn_weights_einsum_cls or layer.attn_weights_value_einsum_cls) and layer.attention_fn is None:
        raise ValueError(
            "qk_attn_weights_einsum_cls / attn_weights_value_einsum_cls are forwarded to "
            "attention_fn; set attention_fn (e.g. flax.linen.dot_product_attention) too"
        )


def resolve_linen_inputs(inputs_q, inputs_k, inputs_v, inputs_kv):
    """`flax.linen.MultiHeadDotProductAttention`'s rules, errors and warnings: k defaults to q, v to k;
    `inputs_kv` (deprecated) sets both. Called from the layer's `__call__` (the warnings' stacklevel)."""
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


def check_nnx_call(layer, inputs_q, decode, lengths, input_positions) -> None:
    """The NNX layer's call arguments that Flax's has or ours adds: in_features, lengths, input_positions."""
    require(
        "",
        "inputs_q features",
        inputs_q.shape[-1],
        inputs_q.shape[-1] == layer.in_features,
        f"in_features = {layer.in_features} (shape {inputs_q.shape})",
    )
    mh.check_lengths(lengths, decode)
    if input_positions is not None and layer.attention_fn is None:
        raise ValueError(
            "input_positions is forwarded to attention_fn, and attention_fn is None; set an "
            "attention_fn that takes it (e.g. nnx.dot_product_attention_with_rope)"
        )


def linen_dropout(layer, deterministic, dropout_rng):
    """The Linen layer's (deterministic, dropout key or None), resolved as `flax.linen`'s layer resolves them."""
    deterministic = layer.dropout_rate == 0.0 or nn.merge_param("deterministic", layer.deterministic, deterministic)
    return deterministic, dropout_rng if deterministic or dropout_rng is not None else layer.make_rng("dropout")


def nnx_dropout(layer, deterministic, rngs):
    """The NNX layer's (deterministic, dropout key or None), resolved as `flax.nnx.MultiHeadAttention` resolves them."""
    if layer.dropout_rate == 0.0:
        return True, None
    deterministic = first_from(
        deterministic,
        layer.deterministic,
        error_msg=(
            "No `deterministic` argument was provided to MultiHeadAttention as either a __call__ argument or class "
            "attribute (it is needed when dropout_rate > 0)."
        ),
    )
    rngs = layer.rngs if rngs is None else rngs.dropout if isinstance(rngs, nnx.Rngs) else rngs
    if deterministic:
        return True, None
    if rngs is None:
        raise ValueError(
            "rngs must be provided to __call__ when dropout is on and the layer was built with keep_rngs=False"
        )
    return False, rngs()


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
    ours = traverse_util.flatten_dict(nnx.to_pure_dict(state))
    theirs = traverse_util.flatten_dict(dict(params))
    for path in sorted(set(ours) | set(theirs)):
        name = "/".join(path)
        if path not in theirs:
            raise ValueError(f"params: {name} is missing (the layer has it, shape {ours[path].shape})")
        if path not in ours:
            raise ValueError(f"params: {name} is not a parameter of this layer ({type(layer).__name__})")
        if tuple(jnp.shape(theirs[path])) != tuple(ours[path].shape):
            raise ValueError(
                f"params: {name} has shape {tuple(jnp.shape(theirs[path]))}; "
                f"the layer expects {tuple(ours[path].shape)}"
            )
    nnx.replace_by_pure_dict(state, traverse_util.unflatten_dict({p: jnp.asarray(v) for p, v in theirs.items()}))
    nnx.update(layer, state)


def resolve_nnx_inputs(inputs_q, inputs_k, inputs_v):
    """`flax.nnx.MultiHeadAttention`'s rules: k defaults to q, v to k."""
    if inputs_k is None:
        if inputs_v is not None:
            raise ValueError(
                "inputs_k cannot be None if inputs_v is not None; to use one array for both, "
                "pass it as inputs_k and leave inputs_v None"
            )
        inputs_k = inputs_q
    return inputs_k, inputs_k if inputs_v is None else inputs_v
