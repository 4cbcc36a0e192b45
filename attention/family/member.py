"""What every member of the attention family shares: its capabilities, and the layout helpers.

A member is a Linen module called by `attention.MultiHeadAttention` (attribute
`attention_type`) on the projected heads, batch axes flattened to one:

    member(query [B, Lq, H, d_k], key [B, Lk, G, d_k], value [B, Lk, G, d_v], *,
           mask [B|1, H|1, Lq|1, Lk|1] bool or None, is_causal, query_offset) -> [B, Lq, H, d_v]

`query_offset` is the absolute position of the first query, an int or one per sequence `[B]`
(non-zero only when decoding over the layer's KV cache; the NNX layer keeps a position per
sequence). A member with `beams_in_place` also takes `beam_rows` under beam search
(`attention.beams`). A member that `projects` (MLA) builds its own heads from the inputs
instead. `Member` records what the layer must check or provide before calling it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp


class Member(NamedTuple):
    """A family member and what it supports; the layer checks a call against it."""

    module: type  # the Linen module; its dataclass fields are the member's `attention_options`
    causal: bool  # honours is_causal
    cross: bool  # keys may come from another sequence than the queries
    decode: str | None  # "kv_cache": over the layer's cache; "state": its own; None: no decoding
    grouped: bool = True  # num_kv_heads < num_heads (GQA/MQA) is meaningful
    projects: bool = False  # makes q/k/v itself from the inputs (the layer's projections unused)
    shared_qk: bool = False  # keys are the queries (no key projection)
    beams_in_place: bool = (
        False  # under beam search, takes `beam_rows` and reads its kv_cache in place (attention.beams)
    )


class LayerFilled(nn.Module):
    """Base of every member module: the numeric settings its layer passes on (see LAYER_FIELDS), declared once."""

    dtype: Any = None
    param_dtype: Any = jnp.float32
    precision: Any = None
    formulation: Any = None  # attention.head.Formulation for the products (None: plain)


def options_of(module: type) -> tuple[str, ...]:
    """The settable hyper-parameters of a member module (the layer sets the rest)."""
    return tuple(f.name for f in dataclasses.fields(module) if f.name not in LAYER_FIELDS and f.init)


# Fields of every member that the layer fills from its own attributes.
LAYER_FIELDS = (
    "dtype",
    "param_dtype",
    "precision",
    "formulation",
    "impl",
    "decode",
    "kernel_init",
    "use_bias",
    "num_heads",
    "head_dim",
    "v_head_dim",
    "parent",
    "name",
)


def key_padding(attention_type: str, mask: jax.Array | None, key_length: int) -> jax.Array | None:
    """A mask `[B|1, H|1, Lq|1, Lk|1]` that only removes keys -> `[B|1, Lk]` bool (None stays None).

    Members that mix keys before the queries see them (low-rank, kernel, hashing) can honour a
    key-padding mask and nothing finer; anything else is a ValueError naming the field.
    """
    if mask is None:
        return None
    if mask.shape[1] != 1 or mask.shape[2] != 1:
        raise ValueError(
            f"mask has shape {tuple(mask.shape)} (batch flattened); attention_type={attention_type!r} "
            "honours only key-padding masks broadcastable to [batch..., 1, 1, Lk] (e.g. "
            "attention.make_padding_mask); use attention_type='softmax' for other masks"
        )
    return jnp.broadcast_to(mask[:, 0, 0, :], (mask.shape[0], key_length))


def grouped_queries(query: jax.Array, num_kv_heads: int) -> jax.Array:
    """`[B, L, H, d]` -> `[B, L, G, R, d]`: query heads grouped by the KV head they share."""
    B, L, H, d = query.shape
    return query.reshape(B, L, num_kv_heads, H // num_kv_heads, d)
