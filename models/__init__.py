"""headcount's encoder-decoder Transformer on `attention.MultiHeadAttention`, and its decoders."""

from models.decoding import beam_search, greedy_decode, init_cache, length_penalty
from models.transformer import (
    HEAD_MASK_KEYS,
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    MlpBlock,
    Transformer,
    TransformerConfig,
    sinusoidal_positions,
)

__all__ = [
    "HEAD_MASK_KEYS",
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "MlpBlock",
    "Transformer",
    "TransformerConfig",
    "beam_search",
    "greedy_decode",
    "init_cache",
    "length_penalty",
    "sinusoidal_positions",
]
