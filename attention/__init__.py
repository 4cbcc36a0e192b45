"""headcount's attention: one-head scaled dot-product attention vmapped into MHA / GQA / MQA.

The public surface is `__all__` (docs/attention.md, "Public API"); a name leaves it only after one
release in which using it warns (`DeprecationWarning`, naming its replacement).
"""

__version__ = "0.3.0"  # the distribution's version (setup.cfg reads it); 0.3.0: the faces read top to bottom

from attention.core import IMPLS, attend, choose_impl, dot_product_attention
from attention.head import Formulation
from attention.geometry import HeadGeometry
from attention.layer import MultiHeadAttention
from attention.linen_names import MultiHeadDotProductAttention, SelfAttention
from attention.masks import combine_masks, make_attention_mask, make_causal_mask, make_padding_mask

from attention import nnx  # attention.nnx.MultiHeadAttention: the flax.nnx layer

__all__ = [
    "Formulation",
    "HeadGeometry",
    "IMPLS",
    "MultiHeadAttention",
    "MultiHeadDotProductAttention",
    "SelfAttention",
    "attend",
    "choose_impl",
    "combine_masks",
    "dot_product_attention",
    "make_attention_mask",
    "make_causal_mask",
    "make_padding_mask",
    "nnx",
]
