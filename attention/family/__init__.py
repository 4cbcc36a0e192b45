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
    "span": Member(Span, causal=True, cross=False, decode="kv_cache"),
    "mla": Member(MLA, causal=True, cross=True, decode="state", grouped=False, projects=True),
}


def member(attention_type: str) -> Member | None:
    """The `Member` named `attention_type` (None for "softmax"); a ValueError for an unknown name."""
    if attention_type not in ATTENTION_TYPES:
        raise ValueError(f"attention_type = {attention_type!r}; expected one of {tuple(ATTENTION_TYPES)}")
    return ATTENTION_TYPES[attention_type]


def check_options(attention_type: str, options) -> dict:
    """`options` (a mapping or None) as a dict, once checked against the member's fields."""
    options = dict(options or {})
    spec = member(attention_type)
    allowed = () if spec is None else options_of(spec.module)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"attention_options = {options!r}: {unknown} not settable for attention_type={attention_type!r}; "
            f"expected keys among {allowed}"
        )
    return options


def supports(attention_type: str, *, causal: bool = False, cross: bool = False, decode: bool = False) -> bool:
    """Whether the member can serve an attention sublayer with these needs ("softmax" serves all)."""
    spec = member(attention_type)
    if spec is None:
        return True
    return (spec.causal or not causal) and (spec.cross or not cross) and (spec.decode is not None or not decode)


def cache_elements_per_token(attention_type: str, geometry, options=None) -> int | None:
    """Decode-cache elements each new token adds per layer (None: the member does not decode).

    MHA/GQA/MQA (and the members decoding over the layer's KV cache) store G (d_k + d_v); MLA
    its latent d_c; Performer none: its state, G m (d_v + 1), does not grow.
    """
    spec = member(attention_type)
    if spec is None or spec.decode == "kv_cache":
        return geometry.kv_cache_elements
    if spec.module is MLA:
        return check_options(attention_type, options).get("latent_dim") or 4 * geometry.head_dim
    return 0 if spec.decode == "state" else None


__all__ = [
    "ATTENTION_TYPES", "Member", "cache_elements_per_token", "check_options", "key_padding", "member",
    "options_of", "supports",
]
