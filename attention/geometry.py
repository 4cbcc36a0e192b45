"""Head geometry: the one place that resolves and checks H, G, d_k and d_v.

Every layer, model config, sharding rule and result table that needs the number of
query heads H, key/value heads G (MHA: G = H, GQA: 1 < G < H, MQA: G = 1), the
query/key head size d_k or the value head size d_v asks a `HeadGeometry` for them,
so their defaults (G = H, d_k = features / H, d_v = d_k) and their checks live here.
"""

from __future__ import annotations

import dataclasses

from attention.checks import is_positive_int, require, require_positive_ints


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
