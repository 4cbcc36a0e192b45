"""BigBird's block-sparse attention (Zaheer et al. 2020, "Big Bird: Transformers for Longer Sequences"), ITC form.

Queries and keys are cut into blocks of b positions; query block i attends key block j when

    |i − j| <= window_blocks          (sliding window: 2w + 1 blocks)
    i < global_blocks or j < global_blocks   (global tokens: the first g blocks see and are seen by all)
    j is one of random_blocks r blocks drawn for row i (fixed by `seed`)

and every other block pair is skipped: the pattern is a static schedule for the exact blockwise
kernel (`attention.impl.blockwise`), so no N × N mask or logit matrix exists. Causal: only pairs
j <= i, the diagonal masked inside. Cost O(N (2w + 1 + g + r) b), global rows O(N) each.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from attention.family.member import LayerFilled
from attention.core import group_heads, to_grouped
from attention.head import Options
from attention.impl import blockwise


def block_pairs(
    num_blocks: int, window_blocks: int, global_blocks: int, random_blocks: int, seed: int, is_causal: bool
) -> np.ndarray:
    """`[P, 2]` (query block, key block) pairs of the BigBird pattern, sorted."""
    rng = np.random.default_rng(seed)
    pairs = set()
    for i in range(num_blocks):
        allowed = range(i + 1) if is_causal else range(num_blocks)
        row = {j for j in allowed if abs(i - j) <= window_blocks or i < global_blocks or j < global_blocks}
        rest = sorted(set(allowed) - row)
        row |= set(rng.choice(rest, size=min(random_blocks, len(rest)), replace=False).tolist()) if rest else set()
        pairs |= {(i, j) for j in row}
    return np.asarray(sorted(pairs), np.int32).reshape(-1, 2)


def schedule(length: int, block: int, pairs: np.ndarray, is_causal: bool) -> blockwise.Schedule:
    """The kernel's plan: pairs on the causal diagonal or touching the padded last block are partial."""
    num_blocks = -(-length // block)
    padded = length % block != 0
    partial = (pairs[:, 0] == pairs[:, 1]) & is_causal
    if padded:
        partial |= (pairs[:, 0] == num_blocks - 1) | (pairs[:, 1] == num_blocks - 1)
    return blockwise.Schedule(block, block, num_blocks, num_blocks, pairs[~partial], pairs[partial])


class BigBird(LayerFilled):
    """Window + global + random block-sparse attention, computed by block skipping."""

    block_size: int = 64  # b: positions per block
    window_blocks: int = 1  # w: blocks on each side of the diagonal
    global_blocks: int = 1  # g: leading blocks that are global
    random_blocks: int = 2  # r: random key blocks per query block
    seed: int = 0  # the random blocks' draw

    @nn.compact
    def __call__(self, query, key, value, *, mask=None, is_causal=False, query_offset=0):
        """query `[B, L, H, d_k]`, key/value `[B, L, G, d]`, mask `[B|1, H|1, L|1, L|1]` -> `[B, L, H, d_v]`."""
        for name in ("block_size", "window_blocks", "global_blocks", "random_blocks", "seed"):
            value_, least = getattr(self, name), 1 if name == "block_size" else 0
            if not isinstance(value_, int) or value_ < least:
                raise ValueError(f"bigbird {name} = {value_!r}; expected an int >= {least}")
        L = query.shape[1]
        if key.shape[1] != L:
            raise ValueError(f"bigbird is self-attention: queries and keys need one length, got {L} and {key.shape[1]}")
        block = min(self.block_size, L)
        pairs = block_pairs(
            -(-L // block), self.window_blocks, self.global_blocks, self.random_blocks, self.seed, is_causal
        )
        dtype = self.dtype or jnp.result_type(query, key, value)
        q, k, v = (x.astype(dtype) for x in to_grouped(query, key, value))
        G = key.shape[2]
        options = Options(is_causal, None, 0.0, None, True, self.precision, block, block)
        out, _ = blockwise.attention(
            q, k, v, group_heads(mask, query.shape[:1], G), None, options, schedule(L, block, pairs, is_causal)
        )
        return out.reshape(*query.shape[:-1], value.shape[-1])
