"""What both `MultiHeadAttention` faces do between the projections and W^O, written once.

The Linen layer (`attention.layer`) and the NNX layer (`attention.nnx`) map Flax's constructor
and call conventions onto these functions and keep the variables (Linen collections, NNX
attributes; the decode cache is loaded and stored as an `attention.cache.KVCache`); everything else
lives here: the checks of the settings (gathered per call into a `Call` by
`attention.flax_compat`), the exact attention and its sown weights, beam search's in-place reads of
a decode step's cache (`attention.beams`), the family dispatch, and the head gates, applied by the
core call itself. Shapes follow Flax: `[batch..., L, heads, head_dim]`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from attention import beams, family
from attention.checks import is_positive_int, require
from attention.core import IMPLS, attend
from attention.geometry import HeadGeometry
from attention.cache import LAYOUT
from attention.grouped import flatten_batch, relayout
from attention.masks import as_bool_mask, head_multiplier


class Call(NamedTuple):
    """One face call, checked (`attention.flax_compat.linen_call` / `nnx_call`): what the rest of it reads."""

    inputs: tuple[jax.Array, jax.Array, jax.Array]  # (inputs_q, inputs_k, inputs_v), k and v by Flax's rules
    geometry: HeadGeometry
    blocks: dict  # `attend`'s block-size keywords
    options: dict  # the family member's options (`attention_options`, checked)
    deterministic: Any  # bool, or None where no dropout is drawn
    dropout_rng: jax.Array | None
    kv_layout: str  # the projected keys/values' layout: a source kept by `cross_kv`'s, else Flax's "BTNH"
    decode: bool  # the call steps the decode cache or a member's own state (`steps_decode_state`)


def steps_decode_state(decode: bool, cache_cross_kv: bool) -> bool:
    """Whether a call steps the layer's KV cache (or a member's own decode state): `decode`, on a layer
    without `cache_cross_kv`. A layer with it keeps its source's keys/values instead (`cross_kv`), which
    `decode` does not change: that is how a cross-attention decodes."""
    return decode and not cache_cross_kv


def check_settings(owner: str, geometry, *, impl: str, block_sizes, fused_qkv: bool, dropout_rate: float) -> dict:
    """Validate what both faces take beyond Flax's arguments; return `attend`'s block-size keywords."""
    if impl not in IMPLS:
        raise ValueError(f"{owner}impl must be one of {IMPLS}, got {impl!r}")
    if block_sizes is not None and not (
        isinstance(block_sizes, (tuple, list)) and len(block_sizes) == 2 and all(map(is_positive_int, block_sizes))
    ):
        raise ValueError(f"{owner}block_sizes = {block_sizes!r}; expected None or (block_q, block_k), positive ints")
    if fused_qkv and geometry.v_head_dim != geometry.head_dim:
        raise ValueError(
            f"{owner}v_head_dim = {geometry.v_head_dim}; fused_qkv=True needs v_head_dim None "
            f"or head_dim ({geometry.head_dim}): q, k and v share one kernel"
        )
    if not 0.0 <= dropout_rate < 1.0:
        raise ValueError(f"{owner}dropout_rate = {dropout_rate!r}; expected a float in [0, 1)")
    return {} if block_sizes is None else dict(zip(("block_q", "block_k"), block_sizes))


def check_fused_inputs(fused_qkv: bool, is_self: bool) -> None:
    if fused_qkv and not is_self:
        raise ValueError(
            "fused_qkv=True projects q, k and v from one input; it needs self-attention "
            "(inputs_k and inputs_v None or the same array as inputs_q)"
        )


def check_lengths(lengths, decode: bool) -> None:
    if lengths is not None and not decode:
        raise ValueError("lengths is a decode argument (the real new tokens per sequence); pass decode=True")


def exact_heads(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    *,
    sow: Callable | None,
    impl: str,
    beam_rows: jax.Array | None = None,
    head_mask: jax.Array | None = None,
    **options,
) -> jax.Array:
    """Softmax attention (`attention.attend`), q `[batch..., Lq, H, d_k]` -> `[batch..., Lq, H, d_v]`.

    k and v in `options["kv_layout"]` (`attend`'s; a decode cache's `attention.cache.LAYOUT`).
    Each head's output is scaled by `head_mask` (`gate_heads`), if given. `sow(weights)`, when given,
    receives the weights `[batch..., H, Lq, Lk]`: "auto" then runs "vmap", and an `impl` that exposes
    none is a ValueError. With `beam_rows` (a decode step's `attention.cache.Read`, `beams_in_place`)
    k and v are a beam-search cache read in place (`attention.beams`).
    """
    x = _exact(query, key, value, sow, impl, beam_rows, options)
    return gate_heads(x, head_mask, query.shape[-2])


def reads_beams_in_place(attention_fn, sow_weights: bool, deterministic) -> bool:
    """Whether a softmax decode step reads a beam-search cache in place (`exact_heads(beam_rows=)`): without a
    user `attention_fn`, sown weights or dropout; otherwise the cache is gathered into each beam's history."""
    return attention_fn is None and not sow_weights and bool(deterministic)


def _exact(query, key, value, sow, impl, beam_rows, options):
    if beam_rows is not None:
        return beams.history_attention(
            query,
            key,
            value,
            beam_rows,
            options["mask"],
            dtype=options.get("dtype"),
            precision=options.get("precision"),
            formulation=options.get("formulation"),
        )
    impl = "vmap" if sow is not None and impl == "auto" else impl
    x, weights = attend(query, key, value, impl=impl, **options)
    if sow is not None:
        if weights is None:
            raise ValueError(
                f"sow_weights=True needs the attention weights, which impl={impl!r} does not "
                "expose; use impl='vmap', 'einsum' or 'auto'"
            )
        sow(weights)
    return x


CROSS_KV = ("cross_key", "cross_value")  # the names of a cross-attention's stored source keys/values
CROSS_LAYOUT = LAYOUT  # their layout, the decode cache's


def cross_kv(stored: tuple | None, project_kv: Callable, store: Callable | None) -> tuple:
    """A cross-attention's (key, value) `[batch..., G, Ls, D]` (`CROSS_LAYOUT`): `stored`, else `project_kv()`'s.

    The projections (`[batch..., Ls, G, D]`) are put in the cache's layout here, once, and
    `store(name, x)`-ed so: later steps read the source as attention computes in, untransposed.
    """
    if stored is not None:
        return stored
    key, value = (relayout(x, "BTNH", CROSS_LAYOUT) for x in project_kv())
    if store is not None:
        for name, x in zip(CROSS_KV, (key, value)):
            store(name, x)
    return key, value


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


def member_input_shapes(spec, geometry, batch: tuple, length: int, in_features: int, in_kv_features: int) -> tuple:
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
    if spec.projects:
        return (B, length, in_features), (B, length, in_kv_features)
    return (B, length, H, d_k), (B, length, G, d_k), (B, length, G, d_v)


def check_cache_size(batch: tuple, max_length: int) -> None:
    """A ValueError unless a cache's batch sizes and max_length are positive ints."""
    require(
        "the cache's ",
        "batch and max_length",
        (*batch, max_length),
        all(map(is_positive_int, (*batch, max_length))),
        "positive ints",
    )


def make_member(layer, options: dict, geometry, *, decode: bool, kernel_init: Callable):
    """The `layer.attention_type` member's Linen module, filled from the layer's settings."""
    return family.instantiate(
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
    spec,
    member: Callable,
    project: Callable,
    use_cache: Callable,
    inputs: tuple,
    mask: jax.Array | None,
    *,
    num_heads: int,
    causal: bool,
    decode: bool,
    head_mask: jax.Array | None = None,
    kv_layout: str = "BTNH",
    **member_kwargs,
) -> jax.Array:
    """Heads `[batch..., Lq, H, d_v]` from a family member (`spec`, `check_member_call`), gated by `head_mask`.

    `project(inputs_q, inputs_k, inputs_v, shared_qk=)` -> (q, k, v), k and v in `kv_layout` (a stored
    cross source's `CROSS_LAYOUT`, else Flax's); `use_cache(k, v, mask, beams_in_place)` ->
    `attention.cache.Read` (None at the Linen layer's init), for members decoding over the layer's KV
    cache. Those members take `kv_layout` and read K/V as they come; the others take Flax's layout.
    """
    batch = inputs[0].shape[:-2]
    run = lambda member_inputs, mask, **extra: member_heads(
        member, member_inputs, mask, num_heads=num_heads, batch=batch, is_causal=causal, **member_kwargs, **extra
    )
    if spec.projects:
        return gate_heads(run(inputs[:2], mask, bool_mask=not decode), head_mask, num_heads)
    query, key, value = project(*inputs, shared_qk=spec.shared_qk)
    if spec.decode != "kv_cache":
        key, value = (relayout(x, kv_layout, "BTNH") for x in (key, value))
        return gate_heads(run((query, key, value), mask), head_mask, num_heads)
    extra: dict[str, Any] = {"kv_layout": kv_layout}
    read = use_cache(key, value, mask, spec.beams_in_place) if decode else None
    if read is not None:  # None: no decode, or the Linen layer's init, which only sizes the cache
        key, value, mask, extra["kv_layout"] = read.key, read.value, read.mask, LAYOUT
        extra["query_offset"] = read.offset.reshape(-1) if read.offset.ndim else read.offset
        if read.beam_rows is not None:
            extra["beam_rows"] = read.beam_rows
    return gate_heads(run((query, key, value), mask, **extra), head_mask, num_heads)


def check_member_call(
    owner: str, layer, geometry, *, is_self: bool, values_are_keys: bool, causal: bool, decode: bool, sow_weights: bool
):
    """`family.check_call` with the settings both faces keep under the same names."""
    return family.check_call(
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


def gate_heads(x: jax.Array, head_mask: jax.Array | None, num_heads: int) -> jax.Array:
    """Heads `[batch..., Lq, H, d_v]`, each scaled by `head_mask` (broadcastable to `[batch..., H]`)."""
    if head_mask is None:
        return x
    return x * head_multiplier(head_mask, x.shape[:-3], num_heads, x.dtype)
