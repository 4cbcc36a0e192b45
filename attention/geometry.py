"""Head sizes and the settings checks of attention/.

`HeadGeometry` resolves the query heads H, key/value heads G, the query/key head size d_k and the
value head size d_v, with their defaults (G = H, d_k = features / H, d_v = d_k). `require` is the
one way attention/ refuses a setting: a ValueError naming the field, its value and what is expected.
"""

from __future__ import annotations

import dataclasses
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


@dataclasses.dataclass(frozen=True)
class HeadGeometry:
    """Resolved head sizes; build one with `HeadGeometry.resolve`."""

    num_heads: int  # query heads H
    num_kv_heads: int  # key/value heads G, a divisor of H
    head_dim: int  # query/key width per head d_k
    v_head_dim: int  # value width per head d_v

    @classmethod
    def resolve(
        cls,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        v_head_dim: int | None = None,
        features: int | None = None,
        features_name: str = "features",
        owner: str = "",
    ) -> HeadGeometry:
        """Fill the defaults and check them; a ValueError names `owner + field`.

        `features` (the width the heads split, e.g. d_model or qkv_features) is needed only
        when `head_dim` is None: d_k = features / H, which must divide evenly; errors call it
        `features_name`.
        """
        require_positive_ints(owner, num_heads=num_heads)
        require_positive_ints(owner, optional=True, num_kv_heads=num_kv_heads, head_dim=head_dim, v_head_dim=v_head_dim)
        kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        require(
            owner,
            "num_kv_heads",
            num_kv_heads,
            num_heads % kv_heads == 0,
            f"a divisor of num_heads ({num_heads}): num_heads ({num_heads}) must be divisible "
            f"by num_kv_heads ({kv_heads})",
        )
        if head_dim is None:
            require(
                owner,
                features_name,
                features,
                is_positive_int(features),
                f"a positive int when head_dim is None (d_k = {features_name} / num_heads)",
            )
            assert isinstance(features, int)  # as just required; narrows `int | None` for the type checker
            require(
                owner,
                features_name,
                features,
                features % num_heads == 0,
                f"divisible by num_heads ({num_heads}) when head_dim is None: {features_name} "
                f"({features}) must be divisible by num_heads ({num_heads})",
            )
            head_dim = features // num_heads
        return cls(num_heads, kv_heads, head_dim, head_dim if v_head_dim is None else v_head_dim)

    @property
    def group_size(self) -> int:
        """Query heads per key/value head, H / G."""
        return self.num_heads // self.num_kv_heads

    @property
    def kv_sharing(self) -> str:
        """'MHA' (G = H), 'MQA' (G = 1, H > 1) or 'GQA'."""
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"

    @property
    def qkv_features(self) -> int:
        """H * d_k: width of the stacked query projections."""
        return self.num_heads * self.head_dim

    @property
    def kv_cache_elements(self) -> int:
        """Cached key + value elements per token per layer: G * (d_k + d_v)."""
        return self.num_kv_heads * (self.head_dim + self.v_head_dim)
