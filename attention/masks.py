"""Attention masks (True = attend) and their validation: one convention, converted at one boundary.

Masks as Flax takes them: `bool` is canonical, and a numeric mask (Flax's helpers return
float32 0/1) means "attend where non-zero", exactly as `jnp.where(mask, ...)` in
`flax.linen.dot_product_attention` reads it. `as_bool_mask` turns either into `bool` once,
where a mask enters (`attention.attend` and the layer's decode path), so every `impl`
sees the same bool mask. Additive masks (0 / -inf, or any learned offset) are not masks:
pass them as `bias`. A float mask holding anything but 0/1 cannot be caught under `jit`
(its values are not known there), so `-inf` in a *mask* means "attend", as in Flax.

The constructors keep Flax's shapes and arguments (`flax.linen.make_attention_mask` and
friends) but return `bool` by default: exact, one byte per entry, and unambiguous next to
a float bias. Pass `dtype=jnp.float32` for Flax's return type.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, overload

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike


def make_attention_mask(
    query_input: ArrayLike,
    key_input: ArrayLike,
    pairwise_fn: Callable[[jax.Array, jax.Array], jax.Array] = jnp.multiply,
    extra_batch_dims: int = 0,
    dtype: Any = jnp.bool_,
) -> jax.Array:
    """Pairwise mask `[batch..., 1, Lq, Lk]` from `query_input [batch..., Lq]`, `key_input [batch..., Lk]`.

    As Flax: `mask[..., 0, i, j] = pairwise_fn(query_input[..., i], key_input[..., j])`,
    e.g. `make_attention_mask(tgt != pad, src != pad)` for a padding mask.
    """
    query_input, key_input = jnp.asarray(query_input), jnp.asarray(key_input)
    if query_input.ndim < 1 or key_input.ndim < 1:
        raise ValueError(
            "make_attention_mask: query_input and key_input need a length axis, got shapes "
            f"{query_input.shape} and {key_input.shape}"
        )
    _check_broadcast(
        "make_attention_mask: batch axes of key_input",
        key_input.shape[:-1],
        query_input.shape[:-1],
    )
    if extra_batch_dims < 0:
        raise ValueError(f"extra_batch_dims must be >= 0, got {extra_batch_dims}")
    mask = pairwise_fn(query_input[..., :, None], key_input[..., None, :])
    mask = jnp.expand_dims(mask, axis=-3)
    mask = jnp.expand_dims(mask, axis=tuple(range(extra_batch_dims)))
    return mask.astype(dtype)


def make_causal_mask(x: ArrayLike, extra_batch_dims: int = 0, dtype: Any = jnp.bool_) -> jax.Array:
    """Causal self-attention mask `[batch..., 1, L, L]` for `x [batch..., L]` (query i sees keys j <= i)."""
    x = jnp.asarray(x)
    if x.ndim < 1:
        raise ValueError(f"make_causal_mask: x needs a length axis, got shape {x.shape}")
    positions = jnp.broadcast_to(jnp.arange(x.shape[-1], dtype=jnp.int32), x.shape)
    causal = lambda q, k: allowed_by_position(q, k, True)
    return make_attention_mask(positions, positions, causal, extra_batch_dims=extra_batch_dims, dtype=dtype)


def make_padding_mask(
    tokens: ArrayLike | None = None,
    *,
    pad_id: int = 0,
    lengths: ArrayLike | None = None,
    max_length: int | None = None,
) -> jax.Array:
    """Key-padding mask `[batch..., 1, 1, L]`: True where the key is a real token.

    Give either `tokens [batch..., L]` (pad positions are `tokens == pad_id`) or
    `lengths [batch...]` with `max_length` (positions `>= lengths` are padding).
    Only keys are masked, so padded *query* rows still attend to the real keys
    and stay finite; combine with `make_attention_mask` for Flax's pairwise form.
    """
    if (tokens is None) == (lengths is None):
        raise ValueError("make_padding_mask: give exactly one of tokens= or lengths=")
    if tokens is not None:
        tokens = jnp.asarray(tokens)
        if tokens.ndim < 1:
            raise ValueError(f"make_padding_mask: tokens need a length axis, got shape {tokens.shape}")
        if max_length is not None:
            raise ValueError("make_padding_mask: max_length only goes with lengths=")
        is_token = tokens != pad_id
    else:
        lengths = jnp.asarray(lengths)
        if not jnp.issubdtype(lengths.dtype, jnp.integer):
            raise ValueError(f"make_padding_mask: lengths must be integers, got dtype {lengths.dtype}")
        if max_length is None or max_length < 1:
            raise ValueError(f"make_padding_mask: lengths= needs max_length >= 1, got {max_length}")
        positions = jnp.arange(max_length).reshape((1,) * lengths.ndim + (max_length,))
        is_token = positions < lengths[..., None]
    return is_token[..., None, None, :]


def combine_masks(*masks: ArrayLike | None, dtype: Any = jnp.bool_) -> jax.Array | None:
    """Logical AND of the given masks (None entries are skipped); None if none remain."""
    present = [jnp.asarray(m) for m in masks if m is not None]
    if not present:
        return None
    ranks = [m.ndim for m in present]
    if len(set(ranks)) != 1:
        raise ValueError(f"combine_masks: masks must have the same rank, got ranks {ranks}")
    return _and_all(present, dtype)


def _and_all(present, dtype):
    try:
        np.broadcast_shapes(*(m.shape for m in present))
    except ValueError:
        raise ValueError(f"combine_masks: mask shapes {[m.shape for m in present]} do not broadcast") from None
    mask = present[0].astype(bool)
    for other in present[1:]:
        mask = jnp.logical_and(mask, other)
    return mask.astype(dtype)


@overload
def and_masks(first: ArrayLike, /, *masks: ArrayLike | None) -> jax.Array: ...
@overload
def and_masks(*masks: ArrayLike | None) -> jax.Array | None: ...
def and_masks(*masks: ArrayLike | None) -> jax.Array | None:
    """Logical AND of masks of any ranks, aligned on their trailing axes (None skipped)."""
    present = [jnp.asarray(m) for m in masks if m is not None]
    if not present:
        return None
    rank = max(m.ndim for m in present)
    return _and_all([m.reshape((1,) * (rank - m.ndim) + m.shape) for m in present], jnp.bool_)


@overload
def allowed_by_position(
    query_pos: jax.Array, key_pos: jax.Array, is_causal: Literal[True], window: tuple[int, int] | None = None
) -> jax.Array: ...
@overload
def allowed_by_position(
    query_pos: jax.Array, key_pos: jax.Array, is_causal: bool, window: tuple[int, int] | None = None
) -> jax.Array | None: ...
def allowed_by_position(
    query_pos: jax.Array, key_pos: jax.Array, is_causal: bool, window: tuple[int, int] | None = None
) -> jax.Array | None:
    """Where the causal / sliding-window structure lets a query attend a key, by absolute positions.

    query_pos and key_pos broadcast against each other (e.g. `[..., Lq, 1]` and `[..., 1, Lk]`);
    query i attends key j when j <= i (causal) and i - left <= j <= i + right (window). The one
    place causal and window masks are built: full passes, blocks, decode caches, members.
    """
    allowed = None
    if is_causal:
        allowed = key_pos <= query_pos
    if window is not None:
        inside = (key_pos >= query_pos - window[0]) & (key_pos <= query_pos + window[1])
        allowed = inside if allowed is None else allowed & inside
    return allowed


def causal_from(offset: ArrayLike, query_length: int, key_length: int) -> jax.Array:
    """`[*offset.shape, Lq, Lk]` bool: query i, at absolute position offset + i, sees keys j <= offset + i.

    A decode step's causality over a cache of `key_length` positions (offset: the first new
    query's position, `[]` or one per sequence); offset 0 is the full pass's top-left causal mask.
    """
    offset = jnp.asarray(offset)
    ones = (1,) * offset.ndim  # ranks spelled out: no implicit rank promotion
    queries = offset[..., None, None] + jnp.arange(query_length, dtype=offset.dtype).reshape(*ones, query_length, 1)
    return allowed_by_position(queries, jnp.arange(key_length, dtype=offset.dtype).reshape(*ones, 1, key_length), True)


def structure_mask(
    query_length: int,
    key_length: int,
    is_causal: bool,
    local_window_size: tuple[int, int] | None,
) -> jax.Array | None:
    """`[Lq, Lk]` mask for causal / sliding-window structure, aligned top-left as in `jax.nn`.

    Query i attends key j when j <= i (causal) and i - left <= j <= i + right (window).
    """
    if not is_causal and local_window_size is None:
        return None
    return allowed_by_position(
        jnp.arange(query_length)[:, None], jnp.arange(key_length)[None, :], is_causal, local_window_size
    )


def with_structure(mask, options, Lq, Lk):
    """`mask` ANDed with `options`' causal / window structure, as a 5-axis grouped mask `[B|1, G|1, R|1, Lq, Lk]`
    (or None): what the dense implementations take."""
    mask = and_masks(mask, structure_mask(Lq, Lk, options.is_causal, options.window))
    return None if mask is None else mask.reshape((1,) * (5 - mask.ndim) + mask.shape)


def normalize_window(local_window_size: int | Sequence[int] | None) -> tuple[int, int] | None:
    """`int` or `(left, right)` -> `(left, right)`, both non-negative ints."""
    if local_window_size is None:
        return None
    window = (
        (local_window_size, local_window_size)
        if isinstance(local_window_size, (int, np.integer))
        else tuple(local_window_size)
    )
    if len(window) != 2 or not all(isinstance(w, (int, np.integer)) and w >= 0 for w in window):
        raise ValueError(
            f"local_window_size must be a non-negative int or a (left, right) pair of them, got {local_window_size!r}"
        )
    return int(window[0]), int(window[1])


def as_bool_mask(name: str, mask: ArrayLike | None, target_shape: Sequence[int]) -> jax.Array | None:
    """`mask` (bool, or numeric: non-zero = attend) as bool, once checked to broadcast to `target_shape`."""
    if mask is None:
        return None
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_ and not jnp.issubdtype(mask.dtype, jnp.number):
        raise ValueError(f"{name} must be bool (True = attend) or numeric (non-zero = attend), got dtype {mask.dtype}")
    _check_broadcast(name, mask.shape, target_shape)
    return mask if mask.dtype == jnp.bool_ else mask != 0


def check_float_like(name: str, array: jax.Array | None, target_shape: Sequence[int]) -> None:
    """Raise a ValueError unless `array` (bias, head mask) is floating point and broadcasts to `target_shape`."""
    if array is None:
        return
    if not jnp.issubdtype(array.dtype, jnp.floating):
        raise ValueError(f"{name} must be a floating-point array, got dtype {array.dtype}")
    _check_broadcast(name, array.shape, target_shape)


def _check_broadcast(name: str, shape: Sequence[int], target_shape: Sequence[int]) -> None:
    fits = len(shape) <= len(target_shape) and all(s in (1, t) for s, t in zip(reversed(shape), reversed(target_shape)))
    if not fits:
        raise ValueError(f"{name} has shape {tuple(shape)}, which does not broadcast to {tuple(target_shape)}")


def head_multiplier(head_mask, batch, num_heads, dtype):
    """`head_mask` broadcastable to `[batch..., H]` -> `[batch..., 1, H, 1]` multiplier."""
    head_mask = jnp.asarray(head_mask)
    if not jnp.issubdtype(head_mask.dtype, jnp.floating):
        raise ValueError(f"head_mask must be a float array, got dtype {head_mask.dtype}")
    if head_mask.ndim == 0:
        raise ValueError(f"head_mask needs a heads axis (shape [..., {num_heads}]), got a scalar")
    check_float_like("head_mask", head_mask, (*batch, num_heads))
    head_mask = head_mask.reshape((1,) * (len(batch) + 1 - head_mask.ndim) + head_mask.shape)
    return head_mask[..., None, :, None].astype(dtype)
