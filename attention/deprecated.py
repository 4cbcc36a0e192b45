"""Old module paths kept for a release: a moved name resolves from its new home, with a `DeprecationWarning`."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any


def moved(old: str, homes: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for the module `old`: each name of `homes` read from its new module, with a warning."""

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        warnings.warn(
            f"{old}.{name} moved to {homes[name]}.{name}; {old} goes in a later release",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(homes[name]), name)

    return __getattr__
