"""Deprecated: `attention.grouped` (the implementations' layout and options) became part of `attention.core`,
`attention.head` and `attention.masks`.

Each name still resolves, with a `DeprecationWarning` naming its new home.
"""

from attention.deprecated import moved

_CORE = ("KV_LAYOUTS", "kv_axes", "relayout", "to_grouped", "group_heads", "flatten_batch")
__getattr__ = moved(
    "attention.grouped",
    {"Options": "attention.head", "with_structure": "attention.masks", **dict.fromkeys(_CORE, "attention.core")},
)
