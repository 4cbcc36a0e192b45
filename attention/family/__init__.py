"""The attention family: exact softmax attention's cheaper or sparser relatives, one selector.

`attention.MultiHeadAttention(attention_type=...)` (and `config.model.attention_type`) picks a
member from `ATTENTION_TYPES`; `attention_options` sets its hyper-parameters (the fields of its
module, `options_of`). "softmax" is the layer's own exact attention (every `impl`).

    member      paper                                   cost in N (time, memory)
    softmax     Vaswani et al. 2017                     N², N² (blockwise: N)
    bigbird     Zaheer et al. 2020                      N (w + g + r) b
    lsh         Kitaev et al. 2020 (Reformer)           n_hashes N c (chunk c)
    linformer   Wang et al. 2020                        N k
    performer   Choromanski et al. 2021 (FAVOR+)        N m d
    entmax      Correia et al. 2019                     N² (sparse weights, learned α)
    span        Sukhbaatar et al. 2019                  N (S + R) with impl="blockwise"
    mla         DeepSeek-AI 2024 (DeepSeek-V2)          N², cache d_c per token
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from attention.family.bigbird import BigBird
from attention.family.entmax import Entmax
from attention.family.linformer import Linformer
from attention.family.lsh import LSH
from attention.family.member import Member, key_padding, options_of
from attention.family.mla import MLA
from attention.family.performer import Performer
from attention.family.span import Span

ATTENTION_TYPES = {
    "softmax": None,  # the layer's exact attention
    "bigbird": Member(BigBird, causal=True, cross=False, decode=None),
    "lsh": Member(LSH, causal=True, cross=False, decode=None, grouped=False, shared_qk=True),
    "linformer": Member(Linformer, causal=False, cross=True, decode=None),
    "performer": Member(Performer, causal=True, cross=True, decode="state"),
    "entmax": Member(Entmax, causal=True, cross=True, decode="kv_cache"),
    "span": Member(Span, causal=True, cross=False, decode="kv_cache", beams_in_place=True),
    "mla": Member(MLA, causal=True, cross=True, decode="state", grouped=False, projects=True),
}


def member(attention_type: str) -> Member | None:
    """The `Member` named `attention_type` (None for "softmax"); a ValueError for an unknown name."""
    if attention_type not in ATTENTION_TYPES:
        raise ValueError(f"attention_type = {attention_type!r}; expected one of {tuple(ATTENTION_TYPES)}")
    return ATTENTION_TYPES[attention_type]


def family_member(attention_type: str) -> Member:
    """`member(attention_type)` for a family member: a ValueError for "softmax" (the layer's own attention) too."""
    variant = member(attention_type)
    if variant is None:
        raise ValueError(f"attention_type = {attention_type!r} is the layer's exact attention, not a family member")
    return variant


def check_options(attention_type: str, options) -> dict:
    """`options` (a mapping or None) as a dict, once checked against the member's fields."""
    options = dict(options or {})
    variant = member(attention_type)
    allowed = () if variant is None else options_of(variant.module)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"attention_options = {options!r}: {unknown} not settable for attention_type={attention_type!r}; "
            f"expected keys among {allowed}"
        )
    return options


def check_call(
    owner: str,
    attention_type: str,
    geometry,
    *,
    is_self: bool,
    values_are_keys: bool,
    causal: bool,
    decode: bool,
    attention_fn,
    dropout_rate: float,
    sow_weights: bool,
    fused_qkv: bool,
    normalize_qk: bool,
) -> Member:
    """The member named `attention_type`, once the layer's settings and this call are checked against it.

    `owner` names the layer class in the ValueError; `values_are_keys`: inputs_v is inputs_k.
    """
    variant = family_member(attention_type)
    problems = [
        (attention_fn is not None, "attention_fn", "None (a user attention_fn replaces softmax only)"),
        (dropout_rate > 0.0, "dropout_rate", "0.0 (the family members have no attention dropout)"),
        (sow_weights, "sow_weights", "False (the family members expose no weights)"),
        (not variant.cross and not is_self, "inputs_k", "None: self-attention only"),
        (causal and not variant.causal, "is_causal", "False: the member cannot be causal (nor decode)"),
        (decode and variant.decode is None, "decode", "False: the member has no decoding"),
        (
            not variant.grouped and geometry.num_kv_heads != geometry.num_heads,
            "num_kv_heads",
            f"None or num_heads ({geometry.num_heads}): the member has no GQA/MQA",
        ),
        ((variant.projects or variant.shared_qk) and fused_qkv, "fused_qkv", "False: the member projects differently"),
        (variant.projects and normalize_qk, "normalize_qk", "False: the member makes its own q/k"),
        (variant.projects and not values_are_keys, "inputs_v", "None or inputs_k: keys and values share a latent"),
    ]
    for bad, field, expected in problems:
        if bad:
            raise ValueError(f"{owner}.{field} with attention_type={attention_type!r}; expected {expected}")
    return variant


def check_state_decode(attention_type: str, variant: Member, *, decode: bool, in_decode_mode: bool, lengths) -> None:
    """A member with its own decode state (`variant.decode == "state"`) decodes in that mode only, one position
    for all."""
    if variant.decode == "state" and decode != in_decode_mode:
        raise ValueError(
            f"decode=True with attention_type={attention_type!r} needs the member's state: call "
            "init_cache(input_shape) or nnx.view(layer, decode=True, batch_size=..., max_length=...) "
            "first"
            if decode
            else f"decode=False with attention_type={attention_type!r} after "
            "init_cache / set_view(decode=True): the member is in decoding mode; run the full pass "
            "on a layer without the decode view"
        )
    if in_decode_mode and lengths is not None:
        raise ValueError(
            f"lengths with attention_type={attention_type!r}: its decode state keeps one position for "
            "the whole batch; leave lengths None (per-sequence lengths need a KV-cache member)"
        )


def decode_state(module, input_shapes) -> tuple:
    """(`module` in decoding mode, its zero `cache` state `{name: array}` for inputs of `input_shapes`).

    Nothing is computed.
    """
    module = module.clone(decode=True)
    inputs = [jax.ShapeDtypeStruct(shape, jnp.float32) for shape in input_shapes]
    state = jax.eval_shape(lambda *x: module.init(jax.random.key(0), *x)["cache"], *inputs)
    return module, {name: jnp.zeros(leaf.shape, leaf.dtype) for name, leaf in state.items()}


def instantiate(attention_type: str, options: dict, **layer_values):
    """The member's Linen module, named `attention_type`, with `options` and the layer values its fields take."""
    module = family_member(attention_type).module
    fields = {f.name for f in dataclasses.fields(module)}
    return module(**{k: v for k, v in layer_values.items() if k in fields}, **options, name=attention_type)


def supports(attention_type: str, *, causal: bool = False, cross: bool = False, decode: bool = False) -> bool:
    """Whether the member can serve an attention sublayer with these needs ("softmax" serves all)."""
    variant = member(attention_type)
    if variant is None:
        return True
    return (
        (variant.causal or not causal) and (variant.cross or not cross) and (variant.decode is not None or not decode)
    )


def cache_elements_per_token(attention_type: str, geometry, options=None) -> int | None:
    """Decode-cache elements each new token adds per layer (None: the member does not decode).

    MHA/GQA/MQA (and the members decoding over the layer's KV cache) store G (d_k + d_v); MLA
    its latent d_c; Performer none: its state, G m (d_v + 2) (numerator, denominator and the
    running shift), does not grow.
    """
    variant = member(attention_type)
    if variant is None or variant.decode == "kv_cache":
        return geometry.kv_cache_elements
    if variant.module is MLA:
        return check_options(attention_type, options).get("latent_dim") or 4 * geometry.head_dim
    return 0 if variant.decode == "state" else None


__all__ = [
    "ATTENTION_TYPES",
    "Member",
    "cache_elements_per_token",
    "check_call",
    "check_options",
    "instantiate",
    "key_padding",
    "member",
    "options_of",
    "supports",
]
