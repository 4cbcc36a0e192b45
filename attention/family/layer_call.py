"""A family member inside a layer face: its checks against the call, its module, and its heads.

Both faces branch here once, at the top of their call, when `attention_type` is not "softmax"; the
exact softmax path never enters this module. Shapes follow Flax: `[batch..., L, heads, head_dim]`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax

from attention.cache import LAYOUT
from attention.core import flatten_batch, relayout
from attention.family import check_call, instantiate
from attention.masks import as_bool_mask


def member_heads(
    call: Callable,
    inputs: tuple,
    mask: jax.Array | None,
    *,
    num_heads: int,
    batch: tuple,
    bool_mask: bool = True,
    **kwargs,
) -> jax.Array:
    """A family member on `inputs` (`[batch..., L, ...]` each) with the batch axes flattened, as members take them.

    The mask becomes bool and `[B|1, H|1, Lq|1, Lk|1]` here (unless `bool_mask` is False: a member
    decoding with its own state checks its own); `call(*inputs, mask=, **kwargs) -> [B, Lq, H, d_v]`.
    """
    n = len(batch)
    if bool_mask:  # inputs[1]: keys `[batch..., Lk, ...]`, or `[batch..., G, Lk, d_k]` with kv_layout "BNTH"
        Lq, Lk = inputs[0].shape[n], inputs[1].shape[n + (kwargs.get("kv_layout") == "BNTH")]
        mask = flatten_batch(as_bool_mask("mask", mask, (*batch, num_heads, Lq, Lk)), batch)
    x = call(*(x.reshape(-1, *x.shape[n:]) for x in inputs), mask=mask, **kwargs)
    return x.reshape(*batch, *x.shape[1:])


def member_input_shapes(variant, geometry, batch: tuple, length: int, in_features: int, in_kv_features: int) -> tuple:
    """Shapes `[B, length, ...]` of a member's call inputs (B = prod(batch)): what its Linen init needs.

    A member that projects takes the layer's inputs, the others its projected q, k, v.
    """
    B, H, G, d_k, d_v = (
        math.prod(batch),
        geometry.num_heads,
        geometry.num_kv_heads,
        geometry.head_dim,
        geometry.v_head_dim,
    )
    if variant.projects:
        return (B, length, in_features), (B, length, in_kv_features)
    return (B, length, H, d_k), (B, length, G, d_k), (B, length, G, d_v)


def make_member(layer, options: dict, geometry, *, decode: bool, kernel_init: Callable):
    """The `layer.attention_type` member's Linen module, filled from the layer's settings."""
    return instantiate(
        layer.attention_type,
        options,
        dtype=layer.dtype,
        param_dtype=layer.param_dtype,
        precision=layer.precision,
        formulation=layer.formulation,
        impl=layer.impl,
        decode=decode,
        kernel_init=kernel_init,
        use_bias=layer.use_bias,
        **dataclasses.asdict(geometry),
    )


def family_heads(
    variant,
    member: Callable,
    project: Callable,
    decode_step: Callable,
    inputs: tuple,
    mask: jax.Array | None,
    *,
    num_heads: int,
    causal: bool,
    decode: bool,
    kv_layout: str = "BTNH",
    **member_kwargs,
) -> jax.Array:
    """Heads `[batch..., Lq, H, d_v]` from a family member (`variant`, `check_member_call`).

    `project(inputs_q, inputs_k, inputs_v, shared_qk=)` -> (q, k, v), k and v in `kv_layout` (a kept
    cross source's `attention.cache.LAYOUT`, else Flax's); `decode_step(k, v, mask, beams_in_place)` ->
    `attention.cache.CacheRead` (None at the Linen layer's init), for members decoding over the layer's KV
    cache. Those members take `kv_layout` and read K/V as they come; the others take Flax's layout.
    """
    batch = inputs[0].shape[:-2]
    run = lambda member_inputs, mask, **extra: member_heads(
        member, member_inputs, mask, num_heads=num_heads, batch=batch, is_causal=causal, **member_kwargs, **extra
    )
    if variant.projects:
        return run(inputs[:2], mask, bool_mask=not decode)
    query, key, value = project(*inputs, shared_qk=variant.shared_qk)
    if variant.decode != "kv_cache":
        key, value = (relayout(x, kv_layout, "BTNH") for x in (key, value))
        return run((query, key, value), mask)
    extra: dict[str, Any] = {"kv_layout": kv_layout}
    read = decode_step(key, value, mask, variant.beams_in_place) if decode else None
    if read is not None:  # None: no decode, or the Linen layer's init, which only sizes the cache
        key, value, mask, extra["kv_layout"] = read.key, read.value, read.mask, LAYOUT
        extra["query_offset"] = read.offset.reshape(-1) if read.offset.ndim else read.offset
        if read.beam_rows is not None:
            extra["beam_rows"] = read.beam_rows
    return run((query, key, value), mask, **extra)


def check_member_call(
    owner: str, layer, geometry, *, is_self: bool, values_are_keys: bool, causal: bool, decode: bool, sow_weights: bool
):
    """`family.check_call` with the settings both faces keep under the same names."""
    return check_call(
        owner,
        layer.attention_type,
        geometry,
        is_self=is_self,
        values_are_keys=values_are_keys,
        causal=causal,
        decode=decode,
        attention_fn=layer.attention_fn,
        dropout_rate=layer.dropout_rate,
        sow_weights=sow_weights,
        fused_qkv=layer.fused_qkv,
        normalize_qk=layer.normalize_qk,
    )
