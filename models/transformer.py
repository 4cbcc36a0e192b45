"""An encoder-decoder Transformer (Vaswani et al. 2017) built only from `attention.MultiHeadAttention`.

Source and target share one vocabulary and one embedding table; with `tie_embeddings` the
output projection is that table transposed. Token ids default to `models.tokens`.

Decoding with the cache (`Transformer.decode(..., decode=True)`): the decoder's self-attention
layers keep their keys/values in the `cache` collection, and the decoder keeps a `position`
counter there too, so the token(s) fed in a call are embedded at their absolute positions
(`position`, `position + 1`, ...). A call that finds no cache (an `init`, or an `apply` with
`mutable=['cache']` on params only) creates it, sized by the target length it is given; the
`apply` (`models.init_cache`) also stores each cross-attention's projected source keys/values
there, which later steps read instead of projecting the source again (`cache_cross_kv`).

Packed rows (several sentence pairs in one row, as `training.data.batching` packs them): the
training call takes segment ids (pair k of a row is segment k on both sides, 0 is padding) and
per-token positions that restart at 0 in each pair. Attention then stays inside a pair: source
self-attention and target-to-source cross-attention within equal segments, target
self-attention causal within its segment; each pair is embedded at its own positions.

Analysis hooks travel in Flax collections, not in the call signatures:
  head_mask     -- gates per attention layer, a float `[H]` or `[B, H]` array at
                   `head_mask/{encoder,decoder}/layer_i/{self,cross}_attention`, multiplying each
                   head's output before W^O (0 ablates a head; the gradient w.r.t. a gate is
                   Michel et al.'s head importance). `head_mask_variables` builds the collection.
  intermediates -- when it is mutable in an `apply`, every attention layer sows its weights
                   `[B, H, Lq, Lk]` there (`.../self_attention/attention_weights`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
from flax.core import FrozenDict
from jax import lax

import attention
from attention import family, geometry
from models import tokens
from models.dropout import Dropout

ACTIVATIONS = {"relu": nn.relu, "gelu": functools.partial(nn.gelu, approximate=False)}


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters of `Transformer`; checked on construction (ValueError naming the field)."""

    vocab_size: int  # shared source/target vocabulary, including pad/eos/bos
    d_model: int = 512  # width of the residual stream and the embeddings
    num_heads: int = 8  # query heads H per attention layer
    num_kv_heads: int | None = None  # key/value heads G (None -> num_heads: MHA; 1: MQA)
    head_dim: int | None = None  # query/key width per head d_k (None -> d_model // num_heads)
    v_head_dim: int | None = None  # value width per head d_v (None -> head_dim)
    num_layers: int = 6  # layers in the encoder, and again in the decoder
    mlp_dim: int = 2048  # hidden width of the position-wise feed-forward block
    dropout_rate: float = 0.1  # on embeddings and on every sublayer's output
    attention_dropout_rate: float = 0.0  # on the attention weights
    pre_ln: bool = True  # True: x + f(LN(x)) and a final LN; False: LN(x + f(x)) (post-LN, Vaswani)
    activation: str = "relu"  # feed-forward activation: 'relu' or 'gelu' (exact, erf-based)
    tie_embeddings: bool = True  # logits = decoder output @ embedding^T (else a separate Dense)
    scale_out_init: bool = False  # W^O and MLP output kernels' init x 1/sqrt(2 num_layers) (GPT-2)
    attention_bias: bool = True  # biases on the attention's q/k/v/out projections (Flax's examples/wmt: none)
    max_len: int = 256  # rows of the sinusoidal position table: the longest sequence
    pad_id: int = tokens.PAD_ID  # padding; masked as a key and ignored by the loss
    eos_id: int = tokens.EOS_ID  # end of sequence; decoding stops at it
    bos_id: int = tokens.BOS_ID  # first decoder input token
    dtype: Any = jnp.float32  # compute dtype (logits are always returned in float32)
    param_dtype: Any = jnp.float32  # parameter dtype
    attention_impl: str = "vmap"  # one of attention.IMPLS
    # attention.family member for every sublayer it can serve (the rest stay softmax, see `_attention`)
    attention_type: str = "softmax"
    attention_options: Mapping[str, Any] = FrozenDict()  # the member's hyper-parameters (attention.family.options_of)
    # the dense layers' and the logits' `lax.dot_general` replacement (None: lax's), e.g. from `backends`
    dot_general: Callable | None = None
    # attention's products and cache writes (attention.Formulation; None: the plain one), e.g. from `backends`
    formulation: Any = None
    # the dropout keep-mask draw (models.dropout.Dropout's `keep`; None: Flax's), e.g. from `backends`
    dropout_keep: Callable | None = None

    def __post_init__(self):
        object.__setattr__(self, "attention_options", FrozenDict(self.attention_options or {}))  # hashable
        self.validate()

    @property
    def geometry(self) -> attention.HeadGeometry:
        """H, G, d_k and d_v with their defaults filled (d_k = d_model / H)."""
        return attention.HeadGeometry.resolve(
            self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            v_head_dim=self.v_head_dim,
            features=self.d_model,
            features_name="d_model",
            owner="TransformerConfig.",
        )

    @property
    def qkv_features(self) -> int:
        """H * d_k: width of the stacked query projections."""
        return self.geometry.qkv_features

    def validate(self) -> None:
        """Raise ValueError naming the first field whose value is out of range."""
        for name in ("vocab_size", "d_model", "num_heads", "num_layers", "mlp_dim", "max_len"):
            _require(name, getattr(self, name), _is_positive_int(getattr(self, name)), "a positive int")
        self.geometry  # resolving H, G, d_k and d_v checks them
        for name in ("dropout_rate", "attention_dropout_rate"):
            value = getattr(self, name)
            _require(name, value, isinstance(value, (int, float)) and 0.0 <= value < 1.0, "in [0, 1)")
        for name in ("pre_ln", "tie_embeddings", "scale_out_init"):
            _require(name, getattr(self, name), isinstance(getattr(self, name), bool), "a bool")
        _require(
            "dot_general",
            self.dot_general,
            self.dot_general is None or callable(self.dot_general),
            "None or a lax.dot_general-like function",
        )
        _require(
            "formulation",
            self.formulation,
            self.formulation is None or isinstance(self.formulation, attention.Formulation),
            "None or an attention.Formulation",
        )
        _require(
            "dropout_keep",
            self.dropout_keep,
            self.dropout_keep is None or callable(self.dropout_keep),
            "None or a function (rng, rate, shape) -> (keep mask, keep probability)",
        )
        _require("activation", self.activation, self.activation in ACTIVATIONS, f"one of {sorted(ACTIVATIONS)}")
        _require(
            "attention_impl", self.attention_impl, self.attention_impl in attention.IMPLS, f"one of {attention.IMPLS}"
        )
        _require(
            "attention_type",
            self.attention_type,
            self.attention_type in family.ATTENTION_TYPES,
            f"one of {tuple(family.ATTENTION_TYPES)}",
        )
        try:
            family.check_options(self.attention_type, self.attention_options)
        except ValueError as error:
            raise ValueError(f"TransformerConfig.{error}") from None
        for name in ("pad_id", "eos_id", "bos_id"):
            value = getattr(self, name)
            _require(
                name,
                value,
                isinstance(value, int) and 0 <= value < self.vocab_size,
                f"an id in [0, vocab_size={self.vocab_size})",
            )
        ids = (self.pad_id, self.eos_id, self.bos_id)
        _require("pad_id/eos_id/bos_id", ids, len(set(ids)) == 3, "three distinct ids")


_is_positive_int = geometry.is_positive_int
_require = functools.partial(geometry.require, "TransformerConfig.")  # (name, value, ok, expected)


def sinusoidal_positions(max_len: int, d_model: int) -> np.ndarray:
    """Vaswani's table [max_len, d_model]: PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(same)."""
    angles = np.arange(max_len)[:, None] / 10000.0 ** (np.arange(0, d_model, 2) / d_model)
    table = np.zeros((max_len, d_model), np.float32)
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles[:, : d_model // 2])
    return table


def _check_tokens(name, tokens, config):
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"{name} must be int tokens [batch, length], got {tokens.dtype} {tokens.shape}")
    if tokens.shape[1] > config.max_len:
        raise ValueError(f"{name} has length {tokens.shape[1]} > config.max_len ({config.max_len})")


# (stack, attention module) of each kind of attention layer in the module tree.
HEAD_MASK_MODULES = {
    "encoder_self": ("encoder", "self_attention"),
    "decoder_self": ("decoder", "self_attention"),
    "decoder_cross": ("decoder", "cross_attention"),
}
HEAD_MASK_KEYS = tuple(HEAD_MASK_MODULES)


def head_mask_variables(config: TransformerConfig, head_mask: dict | None) -> dict:
    """{"head_mask": collection} for `Transformer.apply`'s variables ({} for None).

    head_mask: {kind in `HEAD_MASK_KEYS`: float gates `[num_layers, H]` or `[num_layers, B, H]`};
    kinds left out stay open. Gate arrays may be traced (their gradient is head importance).
    """
    if head_mask is None:
        return {}
    unknown = set(head_mask) - set(HEAD_MASK_KEYS)
    if unknown:
        raise ValueError(f"head_mask keys must be among {HEAD_MASK_KEYS}, got {sorted(unknown)}")
    tree: dict = {}
    for kind, gates in head_mask.items():
        shape = jnp.shape(gates)
        if len(shape) < 2 or shape[0] != config.num_layers or shape[-1] != config.num_heads:
            raise ValueError(
                f"head_mask[{kind!r}] has shape {shape}; expected [num_layers={config.num_layers}, "
                f"(batch,) num_heads={config.num_heads}]"
            )
        stack, module = HEAD_MASK_MODULES[kind]
        for i in range(config.num_layers):
            tree.setdefault(stack, {}).setdefault(f"layer_{i}", {})[module] = gates[i]
    return {"head_mask": tree}


def _out_kernel_init(config):
    """None (the layer's default) or the default init scaled by 1/sqrt(2 num_layers)."""
    if not config.scale_out_init:
        return None
    scale = 1.0 / math.sqrt(2 * config.num_layers)
    return lambda key, shape, dtype=jnp.float32: scale * nn.linear.default_kernel_init(key, shape, dtype)


def _attention(layer, train, name, decode=False, causal=False, cross=False):
    """`layer`'s attention sublayer `name`, called with the hooks the `apply` provides.

    `decode`: the self-attention appends to its KV cache, the cross-attention (`cross`) reuses
    the source's projected keys/values from the cache.

    Reads its head gates from the `head_mask` collection (None when absent) and records its
    weights when `intermediates` is mutable (not in `init`, which would store them). It runs
    `config.attention_type` if that member supports what the sublayer needs (`causal`: the
    decoder's self-attention, which must also decode; `cross`: keys from the encoder), else
    softmax: linformer leaves the decoder's self-attention exact, span the cross-attention.
    """
    config = layer.config
    serves = family.supports(config.attention_type, causal=causal, cross=cross, decode=causal)
    attention_type = config.attention_type if serves else "softmax"
    module = attention.MultiHeadAttention(
        num_heads=config.num_heads,
        num_kv_heads=config.num_kv_heads,
        qkv_features=config.qkv_features,
        v_head_dim=config.v_head_dim,
        use_bias=config.attention_bias,
        dropout_rate=config.attention_dropout_rate,
        deterministic=not train,
        decode=decode and not cross,
        cache_cross_kv=decode and cross,
        out_kernel_init=_out_kernel_init(config),
        impl=config.attention_impl,
        qkv_dot_general=config.dot_general,
        out_dot_general=config.dot_general,
        formulation=config.formulation,
        dtype=config.dtype,
        param_dtype=config.param_dtype,
        attention_type=attention_type,
        attention_options=config.attention_options if serves and attention_type != "softmax" else None,
        name=name,
    )
    hooks = dict(
        head_mask=layer.get_variable("head_mask", name),
        sow_weights=layer.is_mutable_collection("intermediates") and not layer.is_initializing(),
    )
    return functools.partial(module, **hooks)


def _residual(config, sublayer, x, train, norm_name):
    """Pre-LN: x + drop(f(LN(x))); post-LN: LN(x + drop(f(x)))."""
    norm = nn.LayerNorm(dtype=config.dtype, param_dtype=config.param_dtype, name=norm_name)
    drop = Dropout(config.dropout_rate, deterministic=not train, keep=config.dropout_keep)
    if config.pre_ln:
        return x + drop(sublayer(norm(x)))
    return norm(x + drop(sublayer(x)))


def _final_norm(config, x):
    """Pre-LN leaves the residual stream un-normalised, so it ends with a LayerNorm; post-LN does not."""
    if not config.pre_ln:
        return x
    return nn.LayerNorm(dtype=config.dtype, param_dtype=config.param_dtype, name="final_norm")(x)


def _embed(config, embed, tokens, positions, train):
    """tokens [B, L] -> embedding * sqrt(d_model) + sinusoid at `positions` [L] or [B, L], dropped out: [B, L, D]."""
    table = jnp.asarray(sinusoidal_positions(config.max_len, config.d_model), config.dtype)
    position_codes = table[positions]
    x = embed(tokens) * math.sqrt(config.d_model) + (position_codes if positions.ndim == 2 else position_codes[None])
    return Dropout(config.dropout_rate, deterministic=not train, keep=config.dropout_keep)(x)


class MlpBlock(nn.Module):
    """Position-wise feed-forward block: [B, L, D] -> [B, L, mlp_dim] -> [B, L, D]."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        dense = functools.partial(nn.Dense, dtype=cfg.dtype, param_dtype=cfg.param_dtype, dot_general=cfg.dot_general)
        h = ACTIVATIONS[cfg.activation](dense(cfg.mlp_dim, name="wi")(x))
        out_init = _out_kernel_init(cfg) or nn.linear.default_kernel_init
        return dense(cfg.d_model, kernel_init=out_init, name="wo")(h)


class EncoderLayer(nn.Module):
    """Self-attention over the source, then the MLP, each in a residual branch."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x, src_mask, train=False):
        """x: [B, Ls, D]; src_mask: [B, 1, 1 or Ls, Ls] bool (True = a key the query sees). Returns [B, Ls, D]."""
        cfg = self.config
        attend = lambda h: _attention(self, train, "self_attention")(h, mask=src_mask)
        x = _residual(cfg, attend, x, train, "ln_self")
        return _residual(cfg, MlpBlock(cfg, name="mlp"), x, train, "ln_mlp")


class DecoderLayer(nn.Module):
    """Causal self-attention (cached when `decode`), cross-attention to the encoder, then the MLP."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, y, encoded, src_mask, train=False, decode=False, self_mask=None):
        """y: [B, Lt, D]; encoded: [B, Ls, D]; src_mask: [B, 1, 1 or Lt, Ls] bool. Returns [B, Lt, D].

        self_mask: None, or [B, 1, Lt, Lt] bool restricting the (causal) self-attention further.
        """
        cfg = self.config
        self_attention = _attention(self, train, "self_attention", decode=decode, causal=True)
        cross_attention = _attention(self, train, "cross_attention", decode=decode, cross=True)
        y = _residual(cfg, lambda h: self_attention(h, mask=self_mask, is_causal=True), y, train, "ln_self")
        y = _residual(cfg, lambda h: cross_attention(h, encoded, mask=src_mask), y, train, "ln_cross")
        return _residual(cfg, MlpBlock(cfg, name="mlp"), y, train, "ln_mlp")


class Encoder(nn.Module):
    """Source tokens -> contextual vectors."""

    config: TransformerConfig
    embed: nn.Module

    @nn.compact
    def __call__(self, src_tokens, train=False, segments=None, positions=None):
        """src_tokens: [B, Ls] int32; packed rows: segments, positions [B, Ls] int32. Returns [B, Ls, D]."""
        cfg = self.config
        positions = jnp.arange(src_tokens.shape[1]) if positions is None else positions
        x = _embed(cfg, self.embed, src_tokens, positions, train)
        src_mask = _key_mask(cfg, src_tokens, segments, segments)
        for i in range(cfg.num_layers):
            x = EncoderLayer(cfg, name=f"layer_{i}")(x, src_mask, train)
        return _final_norm(cfg, x)


class Decoder(nn.Module):
    """Shifted target tokens + encoder output -> next-token logits."""

    config: TransformerConfig
    embed: nn.Module

    @nn.compact
    def __call__(self, encoded, src_tokens, tgt_in_tokens, train=False, decode=False, packing=None):
        """encoded: [B, Ls, D]; src_tokens: [B, Ls]; tgt_in_tokens: [B, Lt]. Returns [B, Lt, vocab] float32.

        packing: None, or (src_segments [B, Ls], tgt_segments [B, Lt], tgt_positions [B, Lt]) of packed rows.
        """
        cfg = self.config
        if packing is None:
            positions, self_mask = self._positions(tgt_in_tokens.shape[1], decode), None
            src_mask = _key_mask(cfg, src_tokens, None, None)
        else:
            src_segments, tgt_segments, positions = packing
            self_mask = attention.make_attention_mask(tgt_segments, tgt_segments, jnp.equal)
            src_mask = _key_mask(cfg, src_tokens, tgt_segments, src_segments)
        y = _embed(cfg, self.embed, tgt_in_tokens, positions, train)
        for i in range(cfg.num_layers):
            y = DecoderLayer(cfg, name=f"layer_{i}")(y, encoded, src_mask, train, decode, self_mask)
        return self._logits(_final_norm(cfg, y)).astype(jnp.float32)

    def _logits(self, y):
        """y [B, Lt, D] -> [B, Lt, vocab]: y @ embedding^T when tied, else a Dense of its own; one `dot_general`."""
        cfg = self.config
        dot_general = cfg.dot_general or lax.dot_general
        if not cfg.tie_embeddings:
            return nn.Dense(
                cfg.vocab_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype, dot_general=dot_general, name="logits"
            )(y)
        y, table = self.embed.promote_dtype(y, self.embed.embedding, dtype=cfg.dtype)
        return dot_general(y, table, (((y.ndim - 1,), (1,)), ((), ())))  # table [vocab, D]: contract D

    def _positions(self, length, decode):
        """Positions [length] of the fed tokens: 0.. in a full pass, the cache's counter onwards when decoding.

        Feeding more tokens than the cache was sized for is not checked (under jit the
        position lookup clamps; the attention cache drops the positions past its end).
        """
        if not decode:
            return jnp.arange(length)
        is_initialized = self.has_variable("cache", "position")
        counter = self.variable("cache", "position", lambda: jnp.array(0, jnp.int32))
        if not is_initialized:  # the call that sizes the cache sees the whole target
            return jnp.arange(length)
        start = counter.value
        counter.value = start + length
        return start + jnp.arange(length)


def _key_mask(config, src_tokens, query_segments, key_segments):
    """Which source keys a query sees: the real ones ([B, 1, 1, Ls]), or those of its own segment ([B, 1, Lq, Ls]).

    With segments, a padding query (segment 0) sees the padding keys, or none (its output, the
    mean of V, is finite and weighs nothing in the loss).
    """
    if query_segments is None:
        return attention.make_padding_mask(src_tokens, pad_id=config.pad_id)
    return attention.make_attention_mask(query_segments, key_segments, jnp.equal)


class Transformer(nn.Module):
    """Encoder-decoder Transformer. `__call__` for training; `encode` + `decode` for inference."""

    config: TransformerConfig

    def setup(self):
        cfg = self.config
        self.embed = nn.Embed(
            cfg.vocab_size,
            cfg.d_model,
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            # variance 1/d_model: x sqrt(d_model) gives unit-variance inputs, and tied logits stay O(1)
            embedding_init=nn.initializers.normal(stddev=cfg.d_model**-0.5),
        )
        self.encoder = Encoder(cfg, self.embed)
        self.decoder = Decoder(cfg, self.embed)

    def encode(self, src_tokens, train=False, segments=None, positions=None):
        """src_tokens: [B, Ls] int32 (pad_id after the sentence). Returns encoded [B, Ls, D].

        Packed rows: segments and positions [B, Ls] int32 (module docstring).
        """
        _check_tokens("src_tokens", src_tokens, self.config)
        return self.encoder(src_tokens, train, segments, positions)

    def decode(self, encoded, src_tokens, tgt_in_tokens, train=False, decode=False):
        """Logits [B, Lt, vocab] float32 for the next token after each of `tgt_in_tokens` [B, Lt].

        encoded: [B, Ls, D] from `encode`; src_tokens: [B, Ls] (for the cross-attention padding
        mask). decode=True appends to the `cache` collection (apply with mutable=['cache']).
        """
        _check_tokens("tgt_in_tokens", tgt_in_tokens, self.config)
        return self.decoder(encoded, src_tokens, tgt_in_tokens, train, decode)

    def __call__(
        self,
        src_tokens,
        tgt_in_tokens,
        train=False,
        *,
        src_segments=None,
        tgt_segments=None,
        src_positions=None,
        tgt_positions=None,
    ):
        """src_tokens: [B, Ls]; tgt_in_tokens: [B, Lt] (bos_id, then the target shifted right).

        Returns logits [B, Lt, vocab] float32; target padding needs no mask here (the
        self-attention is causal and pads come last), only in the loss. Head gates and
        recorded attention weights: the `head_mask` and `intermediates` collections (module docstring).
        Packed rows: all four of `src_segments`, `tgt_segments`, `src_positions`, `tgt_positions`
        (int [B, Ls] / [B, Lt]; module docstring), or none.
        """
        packing = dict(
            src_segments=src_segments,
            tgt_segments=tgt_segments,
            src_positions=src_positions,
            tgt_positions=tgt_positions,
        )
        given = [name for name, x in packing.items() if x is not None]
        if not given:
            return self.decode(self.encode(src_tokens, train), src_tokens, tgt_in_tokens, train)
        if len(given) < len(packing):
            raise ValueError(f"packed rows need all of {tuple(packing)}; got only {given}")
        for name, x in packing.items():
            tokens = src_tokens if name.startswith("src") else tgt_in_tokens
            if jnp.shape(x) != jnp.shape(tokens):
                raise ValueError(f"{name} has shape {jnp.shape(x)}; expected its tokens' shape {jnp.shape(tokens)}")
        encoded = self.encode(src_tokens, train, src_segments, src_positions)
        _check_tokens("tgt_in_tokens", tgt_in_tokens, self.config)
        return self.decoder(
            encoded, src_tokens, tgt_in_tokens, train, False, (src_segments, tgt_segments, tgt_positions)
        )
