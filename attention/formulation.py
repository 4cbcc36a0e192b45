"""Deprecated: `attention.formulation` became part of `attention.head` (the one-head formula and its products).

Each name still resolves, with a `DeprecationWarning` naming its new home; `attention.Formulation` is unchanged.
"""

from __future__ import annotations

import warnings
from typing import Any

from attention import head

_MOVED = ("Formulation", "PLAIN", "is_nvidia_gpu", "logits_dtype", "products", "resolve", "target")


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module 'attention.formulation' has no attribute {name!r}")
    warnings.warn(
        f"attention.formulation.{name} moved to attention.head.{name}; attention.formulation goes in a later release",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(head, name)
