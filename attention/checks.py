"""The one validation helper of attention/: a ValueError naming the field, its value and what is expected."""

from __future__ import annotations

from typing import Any


def is_positive_int(value: Any) -> bool:
    """A positive Python int (bools excluded)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def require(owner: str, name: str, value: Any, ok: bool, expected: str) -> None:
    """Raise `ValueError("{owner}{name} = {value!r}; expected {expected}")` unless `ok`."""
    if not ok:
        raise ValueError(f"{owner}{name} = {value!r}; expected {expected}")


def require_positive_ints(owner: str, *, optional: bool = False, **values: Any) -> None:
    """`require` each value to be a positive int (or None, if `optional`)."""
    expected = "None or a positive int" if optional else "a positive int"
    for name, value in values.items():
        require(owner, name, value, (optional and value is None) or is_positive_int(value), expected)
