"""`impl="blockwise"`: FlashAttention-2 style exact attention in pure JAX, for long sequences on CPU.

Queries and keys are cut into blocks of `block_q` x `block_k` positions. A static schedule
lists the (query block, key block) pairs that causal / sliding-window structure leaves
non-empty; blocks outside it are never computed, forward or backward. The forward runs an
online softmax (running max `m`, running sum `l`) over the scheduled pairs and saves only the
log-sum-exp per query row; the `custom_vjp` backward recomputes each block's probabilities from
it. Memory is O(N·D + block_q·block_k) instead of O(N²).

Layout inside the kernel: q `[B, G, R, Lq, Dk]` (R = H/G query heads per KV head, already scaled by
1/sqrt(Dk)), k/v `[B, G, Lk, D]`, so GQA/MQA contract each KV head with its R query heads in
one matmul and K/V are never repeated. Every block product is A·B or A·Bᵀ, never Aᵀ·B (a
contraction over both operands' leading axis, slower on XLA:CPU; results/code_choices.md): the backward
keeps dK and dV transposed. Logits accumulate in float32 whatever the input dtype.

Conventions shared with the dense paths: masked logits are `finfo(float32).min`; a query row
whose keys are all masked outputs the mean of V over all keys (and passes gradient only to V),
as the dense softmax over constant logits does. Dropout draws its keep-mask per block from
`fold_in(dropout_rng, block index)`: the same distribution as Flax's, not the same draws.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from attention.head import Options
from attention.masks import allowed_by_position

# 256 x 256: the fastest forward and near-best forward+backward at N = 2048 (results/code_choices.md).
DEFAULT_BLOCK_Q = 256
DEFAULT_BLOCK_K = 256
_MASKED = float(jnp.finfo(jnp.float32).min)


class Schedule(NamedTuple):
    """Static block plan. `full`: pairs needing no structural mask; `partial`: pairs that do."""

    block_q: int
    block_k: int
    num_q_blocks: int
    num_k_blocks: int
    full: np.ndarray  # [P_full, 2] (q block, k block), int32
    partial: np.ndarray  # [P_partial, 2]


def block_schedule(
    query_length: int,
    key_length: int,
    block_q: int,
    block_k: int,
    is_causal: bool,
    window: tuple[int, int] | None,
) -> Schedule:
    """The (q block, k block) pairs holding at least one attended (query, key) position.

    Structure is top-left aligned as in `jax.nn`: query i sees key j when j <= i (causal) and
    i - left <= j <= i + right (window). Rows whose band is empty compute no block at all.
    """
    block_q, block_k = min(block_q, query_length), min(block_k, key_length)
    nq, nk = -(-query_length // block_q), -(-key_length // block_k)
    rows = np.arange(nq * block_q)
    lo = np.zeros_like(rows)
    hi = np.full_like(rows, key_length - 1)
    if is_causal:
        hi = np.minimum(hi, rows)
    if window is not None:
        lo = np.maximum(lo, rows - window[0])
        hi = np.minimum(hi, rows + window[1])
    real = (rows < query_length) & (lo <= hi)
    full: list[tuple[int, int]] = []
    partial: list[tuple[int, int]] = []
    for i in range(nq):
        sl = slice(i * block_q, (i + 1) * block_q)
        if not real[sl].any():
            continue
        row_lo, row_hi = lo[sl][real[sl]], hi[sl][real[sl]]
        for j in range(row_lo.min() // block_k, row_hi.max() // block_k + 1):
            k0, k1 = j * block_k, (j + 1) * block_k - 1
            # full: every row of the block sees every key of it (and no key is padding)
            whole = real[sl].all() and row_lo.max() <= k0 and row_hi.min() >= k1 and k1 < key_length
            (full if whole else partial).append((i, j))
    as_array = lambda pairs: np.asarray(pairs, np.int32).reshape(-1, 2)
    return Schedule(block_q, block_k, nq, nk, as_array(full), as_array(partial))


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array | None,
    bias: jax.Array | None,
    options: Options,
    plan: Schedule | None = None,
) -> tuple[jax.Array, None]:
    """The `attention.core` signature: q `[B, Lq, G, R, Dk]`, k/v `[B, G, Lk, D]` -> (`[B, Lq, G, R, Dv]`, None).

    Pads the lengths to whole blocks, lays the arrays out for the kernel and calls it; JAX
    differentiates the padding and layout, the kernel has its own backward. `plan` replaces
    the causal / window schedule by another block pattern (BigBird's, `attention.family.bigbird`):
    its partial pairs are masked by the causal / window options and the key padding.
    """
    is_causal, window = options.is_causal, options.window
    Lq, Lk = q.shape[1], k.shape[2]
    if plan is None:
        plan = block_schedule(Lq, Lk, options.block_q, options.block_k, is_causal, window)
    pad_q, pad_k = plan.num_q_blocks * plan.block_q - Lq, plan.num_k_blocks * plan.block_k - Lk
    q = q * jnp.asarray(1.0 / math.sqrt(q.shape[-1]), q.dtype)
    q = _pad_axis(jnp.transpose(q, (0, 2, 3, 1, 4)), 3, pad_q, 0)  # [B, G, R, Lq, Dk]
    k, v = (_pad_axis(x, 2, pad_k, 0) for x in (k, v))
    # mask-likes padded to whole blocks where not broadcast
    pad = lambda x, fill: None if x is None else _pad_to_blocks(x, pad_q, pad_k, fill)
    mask, bias = pad(mask, True), pad(bias, 0)
    config = _Config(
        plan=plan,
        key_length=Lk,
        is_causal=is_causal,
        window=window,
        dropout_rate=options.dropout_rate,
        broadcast_dropout=options.broadcast_dropout,
        precision=options.precision,
    )
    out = _kernel(config, q, k, v, mask, bias, options.dropout_rng)
    return jnp.transpose(out[:, :, :, :Lq], (0, 3, 1, 2, 4)), None


def _pad_axis(x, axis, amount, fill):
    if amount == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, amount)
    return jnp.pad(x, widths, constant_values=fill)


def _pad_to_blocks(x, pad_q, pad_k, fill):
    if x.shape[3] > 1:
        x = _pad_axis(x, 3, pad_q, fill)
    if x.shape[4] > 1:
        x = _pad_axis(x, 4, pad_k, fill)
    return x


class _Config(NamedTuple):
    plan: Schedule
    key_length: int
    is_causal: bool
    window: tuple[int, int] | None
    dropout_rate: float
    broadcast_dropout: bool
    precision: Any


def _kernel(config, q, k, v, mask, bias, rng):
    @jax.custom_vjp
    def kernel(q, k, v, mask, bias, rng):
        return _forward(config, q, k, v, mask, bias, rng)[0]

    def fwd(q, k, v, mask, bias, rng):
        out, lse = _forward(config, q, k, v, mask, bias, rng)
        return out, (q, k, v, mask, bias, rng, out, lse)

    def bwd(residuals, d_out):
        return _backward(config, *residuals, d_out)

    kernel.defvjp(fwd, bwd)
    return kernel(q, k, v, mask, bias, rng)


def _slice(x, axis, start, size):
    """`size` entries of `x` from `start` along `axis`; a broadcast (size-1) axis is kept whole."""
    if x.shape[axis] == 1:
        return x
    return lax.dynamic_slice_in_dim(x, start, size, axis)


def _add_at(acc, axis, start, update):
    """`acc[start:start+len] += update` along `axis` (whole axis if it is broadcast)."""
    if acc.shape[axis] == 1:
        return acc + update
    old = lax.dynamic_slice_in_dim(acc, start, update.shape[axis], axis)
    return lax.dynamic_update_slice_in_dim(acc, old + update, start, axis)


def _reduce_to(x, shape):
    """Sum `x` over the axes where `shape` broadcasts (size 1), keeping them."""
    axes = tuple(a for a, (s, t) in enumerate(zip(shape, x.shape)) if s == 1 and t != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


def _block_logits(config, qb, kb, maskb, biasb, i, j, structured):
    """Masked float32 logits `[B, G, R, bq, bk]` of query block i against key block j."""
    plan = config.plan
    s = jnp.einsum("bgrqd,bgkd->bgrqk", qb, kb, precision=config.precision, preferred_element_type=jnp.float32)
    if biasb is not None:
        s = s + biasb.astype(jnp.float32)
    allowed = maskb
    if structured:
        q_pos = i * plan.block_q + lax.broadcasted_iota(jnp.int32, (plan.block_q, plan.block_k), 0)
        k_pos = j * plan.block_k + lax.broadcasted_iota(jnp.int32, (plan.block_q, plan.block_k), 1)
        structure = allowed_by_position(q_pos, k_pos, config.is_causal, config.window)  # None: padding only
        if structure is not None:
            allowed = structure[None, None, None] if allowed is None else allowed & structure[None, None, None]
    if allowed is not None:
        s = jnp.where(allowed, s, _MASKED)
    if structured:  # keys past the real length (block padding) get no weight at all
        s = jnp.where((k_pos < config.key_length)[None, None, None], s, -jnp.inf)
    return s


def _keep(config, rng, i, j, shape):
    """Dropout multiplier (keep / keep_prob) for block (i, j), or None without dropout."""
    if rng is None or config.dropout_rate == 0.0:
        return None
    keep_prob = 1.0 - config.dropout_rate
    block_rng = jax.random.fold_in(rng, i * config.plan.num_k_blocks + j)
    if config.broadcast_dropout:
        shape = (1, 1, 1, *shape[3:])
    return jax.random.bernoulli(block_rng, keep_prob, shape).astype(jnp.float32) / keep_prob


def _blocks(config, q, k, v, mask, bias, i, j):
    plan = config.plan
    qs, ks = i * plan.block_q, j * plan.block_k
    qb = lax.dynamic_slice_in_dim(q, qs, plan.block_q, 3)
    kb = lax.dynamic_slice_in_dim(k, ks, plan.block_k, 2)
    vb = lax.dynamic_slice_in_dim(v, ks, plan.block_k, 2)
    cut = lambda x: None if x is None else _slice(_slice(x, 3, qs, plan.block_q), 4, ks, plan.block_k)
    return qb, kb, vb, cut(mask), cut(bias)


def _scan_pairs(step, carry, plan):
    """Run `step(carry, i, j, structured)` over the full pairs, then the partial ones."""
    for pairs, structured in ((plan.full, False), (plan.partial, True)):
        if len(pairs):
            body = lambda c, ij, structured=structured: (step(c, ij[0], ij[1], structured), None)
            carry, _ = lax.scan(body, carry, jnp.asarray(pairs))
    return carry


def _forward(config, q, k, v, mask, bias, rng):
    """Online softmax over the scheduled blocks -> (out `[B, G, R, Lq, Dv]`, lse `[B, G, R, Lq]`)."""
    plan = config.plan
    rows = q.shape[:-1]  # (B, G, R, Lq)

    def step(carry, i, j, structured):
        m, l, acc = carry
        qb, kb, vb, maskb, biasb = _blocks(config, q, k, v, mask, bias, i, j)
        s = _block_logits(config, qb, kb, maskb, biasb, i, j, structured)
        qs = i * plan.block_q
        m_old, l_old, acc_old = (lax.dynamic_slice_in_dim(x, qs, plan.block_q, 3) for x in (m, l, acc))
        m_new = jnp.maximum(m_old, s.max(axis=-1))
        p = jnp.exp(s - m_new[..., None])
        alpha = jnp.exp(m_old - m_new)
        keep = _keep(config, rng, i, j, s.shape)
        dropped = p if keep is None else p * keep
        pv = jnp.einsum(
            "bgrqk,bgkd->bgrqd",
            dropped.astype(v.dtype),
            vb,
            precision=config.precision,
            preferred_element_type=jnp.float32,
        )
        update = lambda x, blk: lax.dynamic_update_slice_in_dim(x, blk, qs, 3)
        return (
            update(m, m_new),
            update(l, alpha * l_old + p.sum(axis=-1)),
            update(acc, alpha[..., None] * acc_old + pv),
        )

    init = (
        jnp.full(rows, _MASKED, jnp.float32),
        jnp.zeros(rows, jnp.float32),
        jnp.zeros((*rows, v.shape[-1]), jnp.float32),
    )
    m, l, acc = _scan_pairs(step, init, plan)
    # m still at its initial value: every key of the row was masked (or none was scheduled)
    dead = m == _MASKED
    mean_v = v[:, :, : config.key_length].astype(jnp.float32).mean(axis=2)[:, :, None, None]
    out = jnp.where(dead[..., None], mean_v, acc / jnp.where(dead, 1.0, l)[..., None])
    lse = jnp.where(dead, jnp.inf, m + jnp.log(jnp.where(dead, 1.0, l)))
    return out.astype(v.dtype), lse


def _backward(config, q, k, v, mask, bias, rng, out, lse, d_out):
    """Gradients w.r.t. (q, k, v, mask, bias, rng) by recomputing each scheduled block."""
    plan = config.plan
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)  # [B, G, R, Lq]
    # Q and dO transposed once to [B, G, D, R, Lq], and dK, dV accumulated transposed
    # ([B, G, D, Lk]), so that each block's dK^T = Q^T dS and dV^T = dO^T P are plain matmuls:
    # XLA:CPU runs dS^T Q (a contraction over both operands' leading axis) slower (results/code_choices.md).
    q_t, d_out_t = (jnp.moveaxis(x, 4, 2) for x in (q, d_out))

    def step(carry, i, j, structured):
        dq, dk_t, dv_t, d_bias = carry
        qb, kb, vb, maskb, biasb = _blocks(config, q, k, v, mask, bias, i, j)
        qs, ks = i * plan.block_q, j * plan.block_k
        dob, lse_b, delta_b = (lax.dynamic_slice_in_dim(x, qs, plan.block_q, 3) for x in (d_out, lse, delta))
        q_tb, do_tb = (lax.dynamic_slice_in_dim(x, qs, plan.block_q, 4) for x in (q_t, d_out_t))
        s = _block_logits(config, qb, kb, maskb, biasb, i, j, structured)
        p = jnp.exp(s - lse_b[..., None])
        keep = _keep(config, rng, i, j, s.shape)
        dropped = p if keep is None else p * keep
        mm = lambda spec, a, b: jnp.einsum(spec, a, b, precision=config.precision, preferred_element_type=jnp.float32)
        dv_t = _add_at(dv_t, 3, ks, mm("bgdrq,bgrqk->bgdk", do_tb, dropped.astype(d_out.dtype)))
        dp = mm("bgrqd,bgkd->bgrqk", dob, vb)
        if keep is not None:
            dp = dp * keep
        ds = p * (dp - delta_b[..., None])
        dq = _add_at(dq, 3, qs, mm("bgrqk,bgkd->bgrqd", ds.astype(k.dtype), kb))
        dk_t = _add_at(dk_t, 3, ks, mm("bgdrq,bgrqk->bgdk", q_tb, ds.astype(q.dtype)))
        if d_bias is not None:
            block = _reduce_to(ds, tuple(1 if n == 1 else b for n, b in zip(d_bias.shape, ds.shape)))
            d_bias = _add_block(d_bias, block, qs, ks)
        return dq, dk_t, dv_t, d_bias

    zeros = lambda shape: jnp.zeros(shape, jnp.float32)
    transposed = lambda x: (*x.shape[:2], x.shape[3], x.shape[2])
    init = (zeros(q.shape), zeros(transposed(k)), zeros(transposed(v)), None if bias is None else zeros(bias.shape))
    dq, dk_t, dv_t, d_bias = _scan_pairs(step, init, plan)
    dk, dv = jnp.swapaxes(dk_t, 2, 3), jnp.swapaxes(dv_t, 2, 3)
    # rows with every key masked output mean(V): d out / Lk flows to each real key's value
    dead = jnp.isinf(lse)[..., None]
    dead_grad = jnp.where(dead, d_out.astype(jnp.float32), 0.0).sum(axis=(2, 3)) / config.key_length
    real_keys = (jnp.arange(v.shape[2]) < config.key_length)[None, None, :, None]
    dv = dv + jnp.where(real_keys, dead_grad[:, :, None, :], 0.0)
    cast = lambda g, x: None if x is None else g.astype(x.dtype)
    return cast(dq, q), cast(dk, k), cast(dv, v), None, cast(d_bias, bias), None


def _add_block(acc, block, qs, ks):
    """`acc[..., qs:, ks:] += block` on the (maybe broadcast) Lq and Lk axes of a bias gradient."""
    starts = [0, 0, 0, qs if acc.shape[3] > 1 else 0, ks if acc.shape[4] > 1 else 0]
    old = lax.dynamic_slice(acc, starts, block.shape)
    return lax.dynamic_update_slice(acc, old + block, starts)
