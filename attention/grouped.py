"""Deprecated: `attention.grouped` (the implementations' layout and options) became part of `attention.core`,
`attention.head` and `attention.masks`.

Each name still resolves, with a `DeprecationWarning` naming its new home.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_MOVED = {
    "Options": "attention.head",
    "with_structure": "attention.masks",
    **dict.fromkeys(
        ("KV_LAYOUTS", "kv_axes", "relayout", "to_grouped", "group_heads", "flatten_batch"), "attention.core"
    ),
}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module 'attention.grouped' has no attribute {name!r}")
    warnings.warn(
        f"attention.grouped.{name} moved to {_MOVED[name]}.{name}; attention.grouped goes in a later release",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(_MOVED[name]), name)
