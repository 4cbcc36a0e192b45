"""One head's attention, softmax(q kᵀ / √d_k) v, and its `jax.vmap` over heads, KV groups and batch.

`attention_head` is the paper's formula for one head. Its two products come from a `Formulation`:
the plain spelling (Flax's einsums) unless a backend passes a subclass that its compiler runs faster
(`backends.xla_cpu`); a formulation also names the platform the program is for, so `impl="auto"`
chooses for the target rather than for the machine that traces. `vmapped` is `impl="vmap"`: the
formula mapped over the query heads of a KV group, the groups and the batch.

Conventions, here once: logits and softmax in float32 (at least), masked logits at `finfo.min` (a
row with every key masked gets the mean of V, as Flax and `jax.nn`), attention dropout drawn as
`flax.linen.dot_product_attention_weights` draws it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from attention.masks import with_structure


def attention_head(q, k, v, mask=None, bias=None, keep=None, *, scores, mix):
    """q `[Lq, d_k]`, k `[Lk, d_k]`, v `[Lk, d_v]`; mask/bias/keep `[Lq|1, Lk|1]` -> (out `[Lq, d_v]`, weights
    `[Lq, Lk]`).

    The two products come bound (precision and spelling chosen by the caller, as
    `attention.head.products` binds a formulation's): `scores(q, k)` -> q kᵀ `[Lq, Lk]` in float32
    at least (`attention.head.logits_dtype`), `mix(weights, v)` -> weights · v `[Lq, d_v]`.
    `keep` is the dropout multiplier (keep-mask / keep_prob); the weights returned are pre-dropout.
    """
    d_k = q.shape[-1]
    logits = scores(q * jnp.asarray(1 / math.sqrt(d_k), q.dtype), k)
    weights = softmax(logits, mask, bias).astype(v.dtype)
    dropped = weights if keep is None else weights * keep
    return mix(dropped, v), weights


def softmax(logits, mask, bias):
    """Softmax over the last axis of biased logits, masked entries (mask False) at `finfo.min`."""
    if bias is not None:
        logits = logits + bias.astype(logits.dtype)
    if mask is not None:
        logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    return jax.nn.softmax(logits, axis=-1)


def dropout_multiplier(rate, rng, broadcast, logits_shape, dtype):
    """keep-mask / keep_prob over `logits_shape` `[..., Lq, Lk]`, drawn as Flax draws it; None when off.

    Random bits depend only on the flat index, so any reshape of Flax's `[batch..., H, Lq, Lk]`
    (such as `[B, G, H/G, Lq, Lk]`) draws the same mask.
    """
    if rng is None or rate == 0.0:
        return None
    keep_prob = 1.0 - rate
    shape = (1,) * (len(logits_shape) - 2) + tuple(logits_shape[-2:]) if broadcast else logits_shape
    keep = jax.random.bernoulli(rng, keep_prob, shape)
    return keep.astype(dtype) / jnp.asarray(keep_prob, dtype=dtype)


# --- how the products are spelled ---------------------------------------------------------------------


def logits_dtype(dtype):
    """The dtype of logits and softmax: float32, or wider if the inputs are."""
    return jnp.promote_types(dtype, jnp.float32)


class Formulation:
    """The plain formulation; subclass and override a method to respell it for a backend.

    Each method computes the same numbers (up to the order of float sums) in every subclass.
    Instances hold nothing but their platform and compare equal by class and platform, so they can sit
    in a (hashed) config.

    platform: the JAX platform ("cpu", "cuda", "rocm", "tpu"; "gpu" as `jax.default_backend()` names
    CUDA and ROCm) the program is for; None: the process's default backend where it is traced.
    """

    _platform: str | None = None

    def __init__(self, platform: str | None = None):
        if platform is not None and not (isinstance(platform, str) and platform):
            raise ValueError(f"platform = {platform!r}; expected None or a JAX platform name such as 'cpu' or 'cuda'")
        self._platform = None if platform is None else platform.lower()

    @property
    def platform(self) -> str | None:
        """The JAX platform this formulation was chosen for (read-only: it is part of the hash)."""
        return self._platform

    def __eq__(self, other):
        return type(other) is type(self) and other.platform == self.platform

    def __hash__(self):
        return hash((type(self), self.platform))

    def scores(self, q: jax.Array, k: jax.Array, *, precision: Any) -> jax.Array:
        """One head's logits: q `[Lq, d_k]` (already scaled), k `[Lk, d_k]` -> q kᵀ `[Lq, Lk]` in `logits_dtype`."""
        return jnp.einsum("qd,kd->qk", q, k, precision=precision, preferred_element_type=logits_dtype(q.dtype))

    def mix(self, weights: jax.Array, v: jax.Array, *, precision: Any) -> jax.Array:
        """One head's output: weights `[Lq, Lk]`, v `[Lk, d_v]` -> `[Lq, d_v]` in `logits_dtype(v.dtype)`."""
        return jnp.einsum("qk,kd->qd", weights, v, precision=precision, preferred_element_type=logits_dtype(v.dtype))

    def write_cache(self, cache: Any, key: jax.Array, value: jax.Array) -> Any:
        """A decode step's write: `cache` (an `attention.cache.KVCache`) with key `[batch..., L_new, G, d_k]` and
        value `[batch..., L_new, G, d_v]` written at its index (`KVCache.write`), as XLA fuses it."""
        return cache.write(key, value)

    def broadcast_queries(self, queries: jax.Array, shape: tuple[int, ...]) -> jax.Array:
        """Beam search's query block broadcast over a source's rows (`attention.beams.history_attention`)."""
        return jnp.broadcast_to(queries, shape)

    def materialize(self, tree: Any) -> Any:
        """The hook a backend overrides to have arrays computed once and read by every consumer: as they are here.

        The plain steps above do not call it; a backend's override of a step may (XLA:CPU keeps the written
        cache and beam search's query block materialised behind a barrier, `backends.xla_cpu`).
        """
        return tree

    def decode_log_probs(self, logits: jax.Array) -> jax.Array:
        """A decode step's log-probabilities: logits `[N, vocab]` -> log_softmax over the vocabulary, `[N, vocab]`.

        Plain: XLA may fuse log_softmax into the vocabulary matmul as it likes (`models.decoding`).
        """
        return jax.nn.log_softmax(logits)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({'' if self.platform is None else repr(self.platform)})"


PLAIN = Formulation()


def target(platform: str | None) -> str:
    """The platform a program is for: `platform` (lower-cased), or the process's default backend where it is None."""
    return (platform or jax.default_backend()).lower()


def is_nvidia_gpu(platform: str | None) -> bool:
    """Whether `target(platform)` is where cuDNN runs: "cuda", or "gpu" as `jax.default_backend()` names a GPU."""
    return target(platform) in ("cuda", "gpu")


def products(formulation: Formulation | None, precision: Any = None) -> tuple[Callable, Callable]:
    """One head's two products as `attention.head.attention_head` takes them: (scores(q, k), mix(weights, v)),
    `formulation`'s (`resolve`d) with `precision` bound."""
    formulation = resolve(formulation)
    return (
        functools.partial(formulation.scores, precision=precision),
        functools.partial(formulation.mix, precision=precision),
    )


def resolve(formulation: Formulation | None) -> Formulation:
    """`formulation`, or `PLAIN` for None; a ValueError for anything else."""
    if formulation is None:
        return PLAIN
    if not isinstance(formulation, Formulation):
        raise ValueError(f"formulation = {formulation!r}; expected None or an attention.Formulation")
    return formulation


# --- the formula vmapped: impl="vmap" ----------------------------------------------------------------


class Options(NamedTuple):
    """What every implementation (`attention.core`) takes besides the arrays; checked by `attention.attend`."""

    is_causal: bool
    window: tuple[int, int] | None  # (left, right)
    dropout_rate: float  # 0.0 when dropout is off
    dropout_rng: jax.Array | None  # None when dropout is off
    broadcast_dropout: bool
    precision: Any
    block_q: int
    block_k: int
    formulation: Any = PLAIN  # attention.head.Formulation: how the products are spelled


def vmapped(q, k, v, mask, bias, options):
    """`impl="vmap"`: `attention_head` mapped over the query heads of a group, the groups, the batch.

    The implementations' signature (`attention.core`): q `[B, Lq, G, R, d_k]`, k/v `[B, G, Lk, D]`. At the
    innermost level K/V are mapped with `in_axes=None`: the R query heads of a group share their KV head, so
    GQA/MQA never materialise repeated K/V.
    """
    (B, Lq, G, R, _), Lk = q.shape, k.shape[2]
    mask = with_structure(mask, options, Lq, Lk)
    keep = dropout_multiplier(
        options.dropout_rate, options.dropout_rng, options.broadcast_dropout, (B, G, R, Lq, Lk), v.dtype
    )
    extras = (mask, bias, keep)
    # per mapped level (batch, group, head in group): map a real axis, broadcast a size-1 one
    level_axes = [tuple(None if x is None or x.shape[level] == 1 else 0 for x in extras) for level in range(3)]
    scores, mix = products(options.formulation, options.precision)
    fn = functools.partial(attention_head, scores=scores, mix=mix)
    fn = jax.vmap(fn, in_axes=(1, None, None, *level_axes[2]), out_axes=(1, 0))
    fn = jax.vmap(fn, in_axes=(1, 0, 0, *level_axes[1]), out_axes=(1, 0))
    fn = jax.vmap(fn, in_axes=(0, 0, 0, *level_axes[0]), out_axes=(0, 0))
    return fn(q, k, v, *(_drop_broadcast_axes(x) for x in extras))


def _drop_broadcast_axes(x):
    """Remove the size-1 axes among the three mapped leading axes (they are not mapped)."""
    if x is None:
        return None
    return x.reshape(*(s for s in x.shape[:3] if s != 1), *x.shape[3:])
