"""Greedy and beam-search decoding on the decoder's KV cache; both run under `jit` (static shapes).

`model` is a `Transformer` (or anything with its `config`, `encode` and `decode` methods);
`params` its parameters. Outputs are target tokens without the leading BOS, `[B, max_len]`,
with pad_id after the first EOS. One decoder call per generated token: the fed token is
embedded at the cache's position counter. A step reads its cache's every position, filled or
not, so the cache grows with the output instead of holding `max_len` positions from the start:
16, 32, 64, ... then `max_len` (`cache_lengths`), one `while_loop` per length, the arrays
zero-padded in between. A batch that ends early never pays for the rest.

Beam search never reorders the self-attention caches: each beam writes into its own cache row,
and a `[B, K, T]` table of which row holds each position of each beam's hypothesis goes to the
layers in their caches (`attention.cache.KVCache.with_beam_rows`, `attention.beams`), reordered
instead of the keys and values. Only
what a layer keeps of its own (performer's state, MLA's latent) is still reordered.

Length penalty (GNMT, as in Vaswani et al.): lp(n) = ((5 + n) / 6) ** alpha, where n counts
the generated tokens including the EOS; a hypothesis scores log P(tokens) / lp(n).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from attention import head as attention_formulation
from attention.cache import KVCache
from attention.cache import CROSS_KV


def init_cache(model, params, encoded, src_tokens, max_len: int):
    """An empty decode cache for `max_len` target positions and batch `src_tokens.shape[0]`.

    The decoder sizes its cache on the first `decode=True` call that finds none; that call's
    logits are discarded (under jit the pass is dead code and compiled away).
    """
    tgt = jnp.full((src_tokens.shape[0], max_len), model.config.bos_id, jnp.int32)
    _, variables = model.apply(
        {"params": params}, encoded, src_tokens, tgt, method="decode", decode=True, mutable=["cache"]
    )
    return variables["cache"]


def cache_bytes_per_position(model, params, encoded, src_tokens) -> float:
    """Decode-cache bytes one target position adds, per source row.

    Counts the arrays whose shape grows with the cache length (keys, values, MLA's latent), found
    as `_grown_loop` finds the arrays it grows: by their shape changing with the length; counters,
    the source's keys/values and performer's state do not.
    """
    caches = [jax.eval_shape(lambda n=n: init_cache(model, params, encoded, src_tokens, n)) for n in (1, 2)]
    added = sum(
        y.size * y.dtype.itemsize - x.size * x.dtype.itemsize
        for x, y in zip(*map(jax.tree.leaves, caches))
        if x.shape != y.shape
    )
    return added / src_tokens.shape[0]


FIRST_CACHE_LENGTH = 16


def cache_lengths(max_len: int, first: int | None = FIRST_CACHE_LENGTH) -> list[int]:
    """The cache lengths a decode of `max_len` steps grows through: first, 2 first, 4 first, ..., max_len.

    `first=None` keeps one cache of `max_len` positions.
    """
    if first is not None and (not isinstance(first, int) or isinstance(first, bool) or first < 1):
        raise ValueError(f"first_cache_length must be a positive int or None, got {first!r}")
    lengths = []
    while first is not None and first < max_len:
        lengths.append(first)
        first *= 2
    return lengths + [max_len]


def _grown_loop(cond, body, state, empty_cache, lengths):
    """`lax.while_loop(cond, body, state)` with a cache allocated at `lengths[0]` and grown through `lengths`.

    `state.cache` starts as None; `empty_cache(n)` allocates a cache of n positions. On growing, the
    arrays that hold one entry a position (the only ones whose shape changes) are copied into the
    new cache's first positions, the rest kept.
    """

    def grow(old, new):
        return old if old.shape == new.shape else lax.dynamic_update_slice(new, old, (0,) * new.ndim)

    for length in lengths:
        empty = empty_cache(length)
        grown = empty if state.cache is None else jax.tree.map(grow, state.cache, empty)
        segment_cond = lambda s, length=length: cond(s) & (s.step < length)
        state = lax.while_loop(segment_cond, body, state._replace(cache=grown))
    return state


def _decode_step(model, params, cache, encoded, src_tokens, tokens):
    """Feed tokens [N] at the cache position; return (log-probs [N, vocab] float32, new cache).

    The log-probabilities are the formulation's (`Formulation.decode_log_probs`): a backend may keep
    the logits apart from log_softmax there (XLA:CPU does); the plain one leaves the fusion to the compiler.
    """
    logits, variables = model.apply(
        {"params": params, "cache": cache},
        encoded,
        src_tokens,
        tokens[:, None],
        method="decode",
        decode=True,
        mutable=["cache"],
    )
    log_probs = attention_formulation.resolve(model.config.formulation).decode_log_probs(logits[:, -1])
    return log_probs, variables["cache"]


def _check_args(model, src_tokens, max_len):
    if src_tokens.ndim != 2 or not jnp.issubdtype(src_tokens.dtype, jnp.integer):
        raise ValueError(f"src_tokens must be int tokens [batch, length], got {src_tokens.dtype} {src_tokens.shape}")
    if not isinstance(max_len, int) or not 1 <= max_len <= model.config.max_len:
        raise ValueError(f"max_len must be an int in [1, config.max_len={model.config.max_len}], got {max_len!r}")


class _Greedy(NamedTuple):
    """Loop state; B sources, T = max_len."""

    step: jax.Array  # [] int32: tokens generated so far
    cache: Any  # decoder cache, batch B (None until `_grown_loop` allocates it)
    last: jax.Array  # [B] int32: the token each row feeds next
    tokens: jax.Array  # [B, T] int32
    finished: jax.Array  # [B] bool


def greedy_decode(
    model,
    params,
    src_tokens: jax.Array,
    max_len: int,
    first_cache_length: int | None = FIRST_CACHE_LENGTH,
    return_steps: bool = False,
    limit: jax.Array | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Most probable next token at every step. src_tokens: [B, Ls] int. Returns [B, max_len] int32.

    Stops early once every sequence has produced EOS. `first_cache_length`: see `cache_lengths`.
    `return_steps`: also return the decoder steps the loop ran ([] int32), to tell a dearer step
    from a longer search when timing. `limit` ([] int, at most `max_len`; None: `max_len`): the
    tokens to generate at most; an array, so one compiled program of capacity `max_len` serves
    every output cap up to it (pad after the limit).
    """
    _check_args(model, src_tokens, max_len)
    lengths = cache_lengths(max_len, first_cache_length)
    cfg = model.config
    batch = src_tokens.shape[0]
    encoded = model.apply({"params": params}, src_tokens, method="encode")
    empty_cache = lambda length: init_cache(model, params, encoded, src_tokens, length)

    def cond(s: _Greedy):
        go_on = ~jnp.all(s.finished)
        return go_on if limit is None else go_on & (s.step < limit)

    def body(s: _Greedy):
        log_probs, cache = _decode_step(model, params, s.cache, encoded, src_tokens, s.last)
        token = jnp.where(s.finished, cfg.pad_id, jnp.argmax(log_probs, axis=-1).astype(jnp.int32))
        return _Greedy(
            step=s.step + 1,
            cache=cache,
            last=token,
            tokens=lax.dynamic_update_slice(s.tokens, token[:, None], (0, s.step)),
            finished=s.finished | (token == cfg.eos_id),
        )

    state = _Greedy(
        step=jnp.array(0, jnp.int32),
        cache=None,
        last=jnp.full((batch,), cfg.bos_id, jnp.int32),
        tokens=jnp.full((batch, max_len), cfg.pad_id, jnp.int32),
        finished=jnp.zeros((batch,), bool),
    )
    s = _grown_loop(cond, body, state, empty_cache, lengths)
    return (s.tokens, s.step) if return_steps else s.tokens


def length_penalty(length: jax.Array | float, alpha: float) -> jax.Array | float:
    """GNMT's ((5 + length) / 6) ** alpha."""
    return ((5.0 + length) / 6.0) ** alpha


class _Beams(NamedTuple):
    """Loop state; B sources, K beams, T = max_len. Alive beams never contain EOS."""

    step: jax.Array  # [] int32: tokens generated so far
    cache: Any  # decoder cache, batch B*K (beam-major within each source; None until allocated)
    rows: jax.Array  # [B, K, T] int32: the cache row (beam of the source) holding each position of each beam
    last: jax.Array  # [B, K] int32: token each alive beam feeds next
    alive_seqs: jax.Array  # [B, K, T] int32
    alive_logp: jax.Array  # [B, K] float32, sorted descending; -inf = no hypothesis
    finished_seqs: jax.Array  # [B, K, T] int32 (EOS included, pad after)
    finished_scores: jax.Array  # [B, K] float32 length-penalised, sorted descending; -inf = empty slot


def beam_search(
    model,
    params,
    src_tokens: jax.Array,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_len: int = 64,
    return_all_beams: bool = False,
    first_cache_length: int | None = FIRST_CACHE_LENGTH,
    return_steps: bool = False,
    limit: jax.Array | None = None,
) -> tuple[jax.Array, ...]:
    """Beam search with GNMT's length penalty. src_tokens: [B, Ls] int.

    Returns (tokens [B, max_len] int32, scores [B] float32) of the best hypothesis, or all
    `beam_size` of them best first ([B, K, max_len], [B, K]) with `return_all_beams`.
    Hypotheses still without EOS at `max_len` compete with score log P / lp(max_len).
    Stops early once no alive beam can beat the worst finished one (valid for alpha >= 0).
    `first_cache_length`: see `cache_lengths`. `return_steps`: a third output, the decoder steps
    the loop ran ([] int32). `limit`: as `greedy_decode`'s (hypotheses then compete at `limit`).
    """
    return _beam_search(
        model,
        params,
        src_tokens,
        beam_size=beam_size,
        alpha=alpha,
        max_len=max_len,
        return_all_beams=return_all_beams,
        first_cache_length=first_cache_length,
        return_steps=return_steps,
        limit=limit,
    )


def _beam_search(
    model,
    params,
    src_tokens: jax.Array,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_len: int = 64,
    return_all_beams: bool = False,
    first_cache_length: int | None = FIRST_CACHE_LENGTH,
    return_steps: bool = False,
    limit: jax.Array | None = None,
    reorder_cache: bool = True,
) -> tuple[jax.Array, ...]:
    """`beam_search`, and the switch bench/decode_ablation.py times the per-step cache reorder with:
    `reorder_cache=False` leaves what layers keep of their own (performer's state, MLA's latent) in its
    old beam order, which decodes wrong beams for such layers."""
    _check_args(model, src_tokens, max_len)
    # the early-stopping bound's penalty: a Python float without a limit (as it always was), else traced
    final_penalty = (
        length_penalty(max_len, alpha) if limit is None else length_penalty(jnp.asarray(limit, jnp.float32), alpha)
    )
    lengths = cache_lengths(max_len, first_cache_length)
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be a positive int, got {beam_size!r}")
    if not alpha >= 0:
        raise ValueError(f"alpha must be >= 0 (the early-stopping bound needs it), got {alpha!r}")
    cfg = model.config
    batch, K = src_tokens.shape[0], beam_size
    encoded = model.apply({"params": params}, src_tokens, method="encode")
    # every beam is a row of its own: [B*K, ...], the K beams of a source adjacent
    encoded, src_tokens = jnp.repeat(encoded, K, axis=0), jnp.repeat(src_tokens, K, axis=0)
    neg_inf = jnp.float32(-jnp.inf)
    empty_cache = lambda length: init_cache(model, params, encoded, src_tokens, length)

    def cond(s: _Beams):
        # alive log-probs only fall and lp only grows, so logp / lp(limit) bounds any final score
        best_alive = s.alive_logp[:, 0] / final_penalty
        go_on = ~jnp.all(s.finished_scores[:, -1] > best_alive)
        return go_on if limit is None else go_on & (s.step < limit)

    def body(s: _Beams):
        # each beam writes the token it feeds into its own cache row
        rows = lax.dynamic_update_slice(s.rows, jnp.broadcast_to(own_row, (batch, K, 1)), (0, 0, s.step))
        log_probs, cache = _decode_step(
            model, params, _with_beam_rows(s.cache, rows), encoded, src_tokens, s.last.reshape(-1)
        )
        vocab = log_probs.shape[-1]
        # 2K candidates: even if K of them end in EOS, K remain to stay alive
        cand_logp = (s.alive_logp[:, :, None] + log_probs.reshape(batch, K, vocab)).reshape(batch, K * vocab)
        cand_logp, cand = lax.top_k(cand_logp, 2 * K)  # [B, 2K]
        cand_beam, cand_token = cand // vocab, (cand % vocab).astype(jnp.int32)
        cand_seqs = _take_beams(s.alive_seqs, cand_beam)
        cand_seqs = lax.dynamic_update_slice(cand_seqs, cand_token[:, :, None], (0, 0, s.step))
        is_eos = cand_token == cfg.eos_id

        eos_scores = jnp.where(is_eos, cand_logp / length_penalty(s.step + 1, alpha), neg_inf)
        finished_seqs, finished_scores = _top_beams(
            jnp.concatenate([s.finished_seqs, cand_seqs], axis=1),
            jnp.concatenate([s.finished_scores, eos_scores], axis=1),
            K,
        )
        alive_logp, pick = lax.top_k(jnp.where(is_eos, neg_inf, cand_logp), K)
        parents = _take_beams(cand_beam, pick)
        return _Beams(
            step=s.step + 1,
            cache=_gather_cache(cache, parents if reorder_cache else None),
            rows=_take_beams(rows, parents),
            last=_take_beams(cand_token, pick),
            alive_seqs=_take_beams(cand_seqs, pick),
            alive_logp=alive_logp,
            finished_seqs=finished_seqs,
            finished_scores=finished_scores,
        )

    # all K beams start identical: only beam 0 is live, or step 0 would pick K copies
    start_logp = jnp.where(jnp.arange(K) == 0, 0.0, neg_inf)
    empty = jnp.full((batch, K, max_len), cfg.pad_id, jnp.int32)
    own_row = jnp.arange(K, dtype=jnp.int32)[None, :, None]
    s = _grown_loop(
        cond,
        body,
        _Beams(
            step=jnp.array(0, jnp.int32),
            cache=None,
            rows=jnp.zeros((batch, K, max_len), jnp.int32),
            last=jnp.full((batch, K), cfg.bos_id, jnp.int32),
            alive_seqs=empty,
            alive_logp=jnp.broadcast_to(start_logp, (batch, K)),
            finished_seqs=empty,
            finished_scores=jnp.full((batch, K), neg_inf),
        ),
        empty_cache,
        lengths,
    )
    # after an early stop the alive beams rank below every finished one, so this only
    # lets unfinished hypotheses in where fewer than K finished by max_len
    seqs, scores = _top_beams(
        jnp.concatenate([s.finished_seqs, s.alive_seqs], axis=1),
        jnp.concatenate([s.finished_scores, s.alive_logp / length_penalty(s.step, alpha)], axis=1),
        K,
    )
    out = (seqs, scores) if return_all_beams else (seqs[:, 0], scores[:, 0])
    return (*out, s.step) if return_steps else out


def _take_beams(x, beams):
    """x [B, N, ...], beams [B, M] int -> x[b, beams[b, m], ...]: [B, M, ...]."""
    return jax.vmap(lambda row, idx: row[idx])(x, beams)


def _top_beams(seqs, scores, k):
    """The k best of seqs [B, N, T] by scores [B, N], best first."""
    top_scores, idx = lax.top_k(scores, k)
    return _take_beams(seqs, idx), top_scores


def _is_kv_cache(x) -> bool:
    return isinstance(x, KVCache)


def _gather_cache(cache, beams):
    """Reorder every cache array [B*K, ...] so beam k of source b continues beam beams[b, k] (None: keep the order).

    Each self-attention's `KVCache` reorders itself (`KVCache.reorder`: kept in place where the layer
    read it through the beam rows, and its table dropped: a step's input, not loop state). Of the
    rest, scalars (a position counter) are shared by all beams and kept, and so are the source's
    keys/values (loop invariants XLA may hoist); what is reordered is what layers keep of their own:
    performer's state, MLA's latent.
    """

    def reorder(path, x):
        if _is_kv_cache(x):
            return x.reorder(beams)
        # a cross-attention's kept source (`cache_cross_kv`, under `CROSS_KV`'s names): the K beams of a
        # source hold the same one, so reordering it is the identity
        if beams is None or x.ndim == 0 or getattr(path[-1], "key", None) in CROSS_KV:
            return x
        batch, K = beams.shape
        return _take_beams(x.reshape(batch, K, *x.shape[1:]), beams).reshape(x.shape)

    typed = KVCache.typed(cache)
    return KVCache.untyped(jax.tree_util.tree_map_with_path(reorder, typed, is_leaf=_is_kv_cache))


def _with_beam_rows(cache, rows):
    """`cache` with beam search's table, rows [B, K, T], in every self-attention's `KVCache` (`with_beam_rows`)."""
    with_rows = lambda x: x.with_beam_rows(rows) if _is_kv_cache(x) else x
    return KVCache.untyped(jax.tree.map(with_rows, KVCache.typed(cache), is_leaf=_is_kv_cache))
