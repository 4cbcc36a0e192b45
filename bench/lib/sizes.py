"""The model sizes the comparisons run at, in our config's fields and in the peer's."""

from __future__ import annotations

# name: (model sizes, rows, length, reference steps/s: Flax examples/wmt's step on one core, float32)
SIZES = {
    "small": (dict(d_model=256, num_heads=4, num_layers=3, mlp_dim=1024), 20, 64, 1.27),  # configs/default.py
    "base": (dict(d_model=512, num_heads=8, num_layers=6, mlp_dim=2048), 32, 64, 1 / 5.23),  # configs/base.py
}
VOCAB = 8000
PEER_LENGTH = 64  # the peer's packed row length
# The same models in Flax examples/wmt's config fields, and a toy size for dry runs (rows: SIZES', toy 4).
PEER_SIZES = {
    "small": dict(emb_dim=256, qkv_dim=256, mlp_dim=1024, num_heads=4, num_layers=3),
    "base": dict(emb_dim=512, qkv_dim=512, mlp_dim=2048, num_heads=8, num_layers=6),
    "toy": dict(emb_dim=32, qkv_dim=32, mlp_dim=64, num_heads=2, num_layers=1),
}
TOY = dict(d_model=32, num_heads=2, num_layers=1, mlp_dim=64)  # PEER_SIZES["toy"] in our config's fields
