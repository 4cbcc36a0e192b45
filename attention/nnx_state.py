"""The NNX layer's decode state: Flax NNX's entry points (`init_cache`, `set_view`) and the per-call reads and writes.

A mixin of `attention.nnx.MultiHeadAttention`, which provides the settings it reads (`geometry`,
`attention_type`, `cache_cross_kv`, ...; the constructor arguments it keeps are declared, typed, in
`Settings`). The state is one of three: the KV cache (`cached_key`, `cached_value`, `cache_index
[batch...]`, an `attention.cache.KVCache`, with beam search's `beam_rows` table when the caller sets one),
a family member's own state, or a cross-attention's kept source keys/values (`cross_key`, `cross_value`:
`[batch..., G, 0, d]` once set up and empty, the source's once stored; None: no decode state, the source is
projected at every call).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from attention import family
from attention.cache import BEAM_ROWS, VARIABLES, KVCache, check_cache_size, cross_kv
from attention.family.layer_call import member_input_shapes


class Settings:
    """The constructor arguments the NNX layer keeps as attributes (Flax's layer keeps them so), typed.

    `attention.nnx.MultiHeadAttention.__init__` sets each one named here (`SETTINGS`), in this order.
    """

    in_features: int
    dtype: Any
    param_dtype: Any
    broadcast_dropout: bool
    dropout_rate: float
    deterministic: bool | None
    precision: Any
    use_bias: bool
    attention_fn: Callable[..., jax.Array] | None
    decode: bool | None
    normalize_qk: bool
    qkv_promote_dtype: Callable
    out_promote_dtype: Callable
    ln_promote_dtype: Callable
    qkv_dot_general: Any
    out_dot_general: Any
    qkv_dot_general_cls: Any
    out_dot_general_cls: Any
    impl: str
    block_sizes: tuple[int, int] | None
    fused_qkv: bool
    attention_type: str
    formulation: Any
    cache_cross_kv: bool


SETTINGS = tuple(Settings.__annotations__)  # their names, in the order the constructor sets them


class DecodeState(Settings):
    """The NNX layer's decode variables: allocated by `init_cache` / `set_view`, read and written by its calls."""

    def _has_cache(self):
        variant = family.member(self.attention_type)
        if variant is not None and variant.decode == "state":
            return getattr(self, self.attention_type).to_nnx__module.decode
        return (self.cross_key if self.cache_cross_kv else self.cached_key) is not None

    def _allocate(self, batch, max_length, dtype):
        """The decode state for `batch` sequences of `max_length`: the KV cache, a member's own, or (cross) an empty
        kept source; no beam table."""
        check_cache_size(batch, max_length)
        variant = family.member(self.attention_type)
        setattr(self, BEAM_ROWS, nnx.data(None))  # a new search hands in its own table
        if self.cache_cross_kv:  # a new source, none kept yet: the next call stores its keys/values
            G, d_k, d_v = self.num_kv_heads, self.head_dim, self.v_head_dim
            self.cross_key = nnx.Cache(jnp.zeros((*batch, G, 0, d_k), dtype))
            self.cross_value = nnx.Cache(jnp.zeros((*batch, G, 0, d_v), dtype))
        elif variant is not None and variant.decode == "state":  # the member's own state, shaped by its Linen init
            member = getattr(self, self.attention_type)
            shapes = member_input_shapes(
                variant, self.geometry, batch, max_length, self.in_features, self.in_kv_features
            )
            member.to_nnx__module, state = family.decode_state(member.to_nnx__module, shapes)
            for name, zeros in state.items():
                setattr(member, name, nnx.Cache(zeros))
        else:
            empty = KVCache.empty(batch, max_length, self.num_kv_heads, self.head_dim, self.v_head_dim, dtype)
            for name, x in empty.store().items():
                setattr(self, name, nnx.Cache(x))

    def init_cache(self, input_shape: tuple[int, ...], dtype: Any = jnp.float32):
        """Allocate the decode cache for inputs `[batch..., max_length, features]` (as Flax's)."""
        if len(input_shape) < 2:
            raise ValueError(
                f"init_cache: input_shape must be [batch..., max_length, features], got {tuple(input_shape)}"
            )
        self._allocate(tuple(input_shape[:-2]), input_shape[-2], dtype)

    def set_view(
        self,
        deterministic: bool | None = None,
        decode: bool | None = None,
        batch_size: int | tuple[int, ...] | None = None,
        max_length: int | None = None,
    ):
        """Used by `nnx.view`: set modes; with `decode=True`, allocate the cache if it is missing or sized here."""
        self.deterministic = self.deterministic if deterministic is None else deterministic
        self.decode = self.decode if decode is None else decode
        if not decode or (self._has_cache() and batch_size is None and max_length is None):
            return
        if batch_size is None or max_length is None:
            raise ValueError(
                f"set_view(decode=True) allocates the cache and needs batch_size and max_length, got "
                f"batch_size={batch_size!r}, max_length={max_length!r}"
            )
        self._allocate((batch_size,) if isinstance(batch_size, int) else tuple(batch_size), max_length, self.dtype)

    def _decode_step(self, key, value, mask, lengths, beams_in_place=False):
        """One `KVCache.step` over the cache attributes -> what attention reads (`cache.CacheRead`).

        A `beam_rows` table, if the caller set one, is read as the Linen layer reads its cache's: in place
        where `beams_in_place`, else gathered into each beam's history; it stays the caller's (not stored back).
        """
        variables = {name: getattr(self, name) for name in VARIABLES}
        if any(variable is None for variable in variables.values()):
            raise ValueError(
                "decode=True needs the cache: call init_cache(input_shape) or "
                "nnx.view(layer, decode=True, batch_size=..., max_length=...) first"
            )
        values = {name: variable[...] for name, variable in variables.items()}
        table = getattr(self, BEAM_ROWS)
        if table is not None:
            values[BEAM_ROWS] = table[...] if isinstance(table, nnx.Variable) else table
        stored = KVCache.load(values)
        assert stored is not None  # every variable is there
        new, read = stored.step(
            key,
            value,
            mask,
            num_heads=self.num_heads,
            lengths=lengths,
            formulation=self.formulation,
            beams_in_place=beams_in_place,
        )
        stored_back = new.store()
        for name in VARIABLES:
            variables[name][...] = stored_back[name]
        return read

    def _cross_kv(self, project_kv):
        """(key, value) of the kept source (`cache_cross_kv`); with none kept, `project_kv()`'s, stored if the
        decode state is set up (`init_cache` / `set_view`)."""
        if self.cross_key is not None and self.cross_key.shape[-2]:  # a source is kept
            return self.cross_key[...], self.cross_value[...]
        store = None if self.cross_key is None else lambda name, x: getattr(self, name).set_value(x)
        return cross_kv(None, project_kv, store)
