"""headcount's encoder-decoder Transformer on `attention.MultiHeadAttention`, and its decoders."""

from models.decoding import beam_search, greedy_decode, init_cache, length_penalty
from models.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from models.transformer import (
    HEAD_MASK_KEYS,
    HEAD_MASK_MODULES,
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    MlpBlock,
    Transformer,
    TransformerConfig,
    head_mask_variables,
    sinusoidal_positions,
)

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "HEAD_MASK_KEYS",
    "HEAD_MASK_MODULES",
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "MlpBlock",
    "PAD_ID",
    "Transformer",
    "TransformerConfig",
    "UNK_ID",
    "beam_search",
    "greedy_decode",
    "head_mask_variables",
    "init_cache",
    "length_penalty",
    "sinusoidal_positions",
]
