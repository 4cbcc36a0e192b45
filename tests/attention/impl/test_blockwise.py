"""`impl="blockwise"`: values and gradients against the NumPy reference, the block schedule, dropout, auto."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention
import reference
from attention.impl.blockwise import block_schedule
from attention.masks import structure_mask


def random_qkv(batch=2, lq=37, lk=37, heads=4, kv_heads=2, dk=8, dv=8, seed=0):
    rng = np.random.default_rng(seed)
    draw = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    return (
        draw(batch, lq, heads, dk),
        draw(batch, lk, kv_heads, dk),
        draw(batch, lk, kv_heads, dv),
        draw(batch, lq, heads, dv),
    )


def structure(lq, lk, causal, window):
    left, right = window if window is not None else (lq + lk, lq + lk)
    i, j = np.arange(lq)[:, None], np.arange(lk)[None, :]
    return (j >= i - left) & (j <= i + right) & ((j <= i) | (not causal))


CASES = {
    # name: (kv_heads, lq, lk, is_causal, window, padding mask?)
    "causal-gqa": (2, 37, 37, True, None, False),
    "padding-mha": (4, 37, 37, False, None, True),
    "window-mqa": (1, 37, 37, False, (5, 3), False),
    "causal-window-padding-gqa": (2, 37, 37, True, (9, 0), True),
    "cross-lengths-mqa": (1, 21, 45, False, None, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_value_and_gradient_match_numpy(case):
    kv_heads, lq, lk, causal, window, padded = CASES[case]
    q, k, v, d_out = random_qkv(lq=lq, lk=lk, kv_heads=kv_heads)
    mask = None
    if padded:  # keys past each sequence's length are padding: [B, 1, 1, Lk]
        mask = (np.arange(lk)[None, :] < np.array([[lk - 6], [lk]]))[:, None, None, :]
    # blocks 8 x 16 do not divide the lengths
    fn = lambda q, k, v: attention.dot_product_attention(
        q, k, v, mask=mask, is_causal=causal, local_window_size=window, impl="blockwise", block_q=8, block_k=16
    )
    out, vjp = jax.vjp(jax.jit(fn), q, k, v)
    expected_mask = structure(lq, lk, causal, window) if mask is None else structure(lq, lk, causal, window) & mask
    np.testing.assert_allclose(out, reference.attention(q, k, v, mask=expected_mask)[0], atol=1e-5, rtol=1e-5)
    for got, want in zip(vjp(d_out), reference.attention_grads(q, k, v, d_out, mask=expected_mask)):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_bias_gradient_matches_numpy_by_differences():
    """d loss / d bias is the logits' gradient, summed over the bias's broadcast axes."""
    q, k, v, d_out = random_qkv(lq=13, lk=13)
    bias = np.random.default_rng(3).standard_normal((1, 4, 1, 13)).astype(np.float32)  # per head and key
    loss = lambda bias: jnp.sum(
        attention.dot_product_attention(q, k, v, bias=bias, is_causal=True, impl="blockwise", block_q=4, block_k=8)
        * d_out
    )
    grad = jax.grad(loss)(bias)
    ref_loss = lambda b: np.sum(reference.attention(q, k, v, mask=structure(13, 13, True, None), bias=b)[0] * d_out)
    eps, numeric = 1e-4, np.zeros_like(bias, np.float64)
    for index in np.ndindex(bias.shape):
        step = np.zeros(bias.shape)
        step[index] = eps
        numeric[index] = (ref_loss(bias + step) - ref_loss(bias - step)) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, atol=1e-4)


def test_bfloat16_value_and_gradient_within_bfloat16_tolerance():
    q, k, v, d_out = random_qkv(kv_heads=2)
    as_bf16 = lambda x: jnp.asarray(x, jnp.bfloat16)
    fn = lambda q, k, v: attention.dot_product_attention(
        q, k, v, is_causal=True, impl="blockwise", block_q=8, block_k=16
    )
    out, vjp = jax.vjp(fn, *(as_bf16(x) for x in (q, k, v)))
    assert out.dtype == jnp.bfloat16
    rounded = [np.asarray(as_bf16(x), np.float32) for x in (q, k, v, d_out)]
    mask = structure(37, 37, True, None)
    np.testing.assert_allclose(
        np.asarray(out, np.float32), reference.attention(*rounded[:3], mask=mask)[0], atol=3e-2, rtol=3e-2
    )
    grads = vjp(as_bf16(d_out))
    for got, want in zip(grads, reference.attention_grads(*rounded, mask=mask)):
        assert got.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=6e-2, rtol=6e-2)


@pytest.mark.parametrize("lq, lk, bq, bk", [(37, 37, 8, 16), (64, 64, 16, 16), (21, 45, 4, 8), (50, 30, 16, 8)])
@pytest.mark.parametrize("causal, window", [(True, None), (False, (5, 3)), (True, (9, 0)), (False, (0, 40))])
def test_schedule_holds_exactly_the_blocks_with_an_attended_position(lq, lk, bq, bk, causal, window):
    plan = block_schedule(lq, lk, bq, bk, causal, window)
    allowed = np.asarray(structure_mask(lq, lk, causal, window))
    padded = np.zeros((plan.num_q_blocks * bq, plan.num_k_blocks * bk), bool)
    padded[:lq, :lk] = allowed
    blocks = padded.reshape(plan.num_q_blocks, bq, plan.num_k_blocks, bk)
    needed = {tuple(p) for p in np.argwhere(blocks.any(axis=(1, 3)))}
    whole = {tuple(p) for p in np.argwhere(blocks.all(axis=(1, 3)))}
    assert {tuple(p) for p in plan.full} | {tuple(p) for p in plan.partial} == needed
    assert {tuple(p) for p in plan.full} <= whole  # unmasked blocks really need no mask


def scan_lengths(jaxpr):
    """Total iterations of every `scan` in a (closed) jaxpr, nested jaxprs included."""
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            total += eqn.params["length"]
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else [param]:
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    total += scan_lengths(sub.jaxpr)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    total += scan_lengths(sub)
    return total


@pytest.mark.parametrize("causal, window, blocks", [(False, None, 16), (True, None, 10), (False, (256, 0), 7)])
def test_skipped_blocks_are_not_computed_forward_or_backward(causal, window, blocks):
    """N = 1024 in 256 x 256 blocks: 16 in all, 10 on or below the diagonal, 7 in a 256-wide band."""
    q = k = v = jnp.zeros((1, 1024, 2, 8))
    fn = lambda q, k, v: attention.dot_product_attention(
        q, k, v, is_causal=causal, local_window_size=window, impl="blockwise", block_q=256, block_k=256
    )
    assert scan_lengths(jax.make_jaxpr(fn)(q, k, v).jaxpr) == blocks
    grad = jax.grad(lambda q, k, v: fn(q, k, v).sum(), argnums=(0, 1, 2))
    assert scan_lengths(jax.make_jaxpr(grad)(q, k, v).jaxpr) == 2 * blocks  # forward + backward


@pytest.mark.parametrize("broadcast", [True, False])
def test_dropout_drops_weights_and_backward_uses_the_same_keep_mask(broadcast):
    """With V = identity the output *is* the dropped weight matrix, so the keep-mask can be read off."""
    lk, rate = 24, 0.4
    q, k, _, d_out = random_qkv(lq=20, lk=lk, heads=2, kv_heads=2, dv=lk)
    v = np.broadcast_to(np.eye(lk, dtype=np.float32)[None, :, None, :], (2, lk, 2, lk))
    fn = lambda q, k, v: attention.dot_product_attention(
        q,
        k,
        v,
        is_causal=True,
        impl="blockwise",
        block_q=8,
        block_k=8,
        dropout_rate=rate,
        dropout_rng=jax.random.key(3),
        deterministic=False,
        broadcast_dropout=broadcast,
    )
    out, vjp = jax.vjp(fn, q, k, v)
    mask = structure(20, lk, True, None)
    _, weights = reference.attention(q, k, v, mask=mask)  # [B, H, Lq, Lk]
    dropped = np.moveaxis(np.asarray(out, np.float64), 1, 2)  # [B, H, Lq, Lk]
    keep = dropped > 0
    np.testing.assert_allclose(dropped, np.where(keep, weights / (1 - rate), 0.0), atol=1e-5)
    attended = np.broadcast_to(mask, keep.shape)
    assert abs(1 - keep[attended].mean() - rate) < 0.08  # ~480 attended entries per (B, H)
    if broadcast:
        assert np.all(keep[:, :, attended[0, 0]] == keep[:1, :1, attended[0, 0]])
    else:
        assert not np.all(keep[0, 0] == keep[1, 1])
    multiplier = np.where(keep, 1 / (1 - rate), 0.0)
    for got, want in zip(vjp(d_out), reference.attention_grads(q, k, v, d_out, mask=mask, keep=multiplier)):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_auto_picks_by_length_and_logs_once(caplog):
    # the crossovers measured in results/attention_bench.md
    assert attention.choose_impl(512, 512, jnp.float32, 64, 64, False, False) == "vmap"
    assert attention.choose_impl(1024, 1024, jnp.float32, 64, 64, False, False) == "blockwise"
    assert attention.choose_impl(256, 256, jnp.float32, 64, 64, False, False, skips_blocks=True) == "vmap"
    assert attention.choose_impl(512, 512, jnp.float32, 64, 64, False, False, skips_blocks=True) == "blockwise"
    q, k, v, _ = random_qkv()
    with caplog.at_level(logging.INFO, logger="attention.core"):
        for _ in range(2):
            out = attention.dot_product_attention(q, k, v, impl="auto", is_causal=True)
    np.testing.assert_allclose(out, reference.attention(q, k, v, mask=structure(37, 37, True, None))[0], atol=1e-5)
    # logged at most once per process (an earlier test may have logged it already)
    assert len([r for r in caplog.records if "impl='auto' uses 'vmap'" in r.getMessage()]) <= 1


def test_bad_block_sizes_raise():
    q, k, v, _ = random_qkv()
    with pytest.raises(ValueError, match="block_q must be a positive int, got 0"):
        attention.dot_product_attention(q, k, v, impl="blockwise", block_q=0)


def planned_temp_bytes(length: int, impl: str, causal: bool) -> int:
    """XLA's planned temporaries (`memory_analysis()`, compile only) of a forward+backward at [1, length, 2, 32]."""
    shape = jax.ShapeDtypeStruct((1, length, 2, 32), jnp.float32)
    loss = lambda q, k, v: jnp.sum(attention.dot_product_attention(q, k, v, is_causal=causal, impl=impl))
    return (
        jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        .lower(shape, shape, shape)
        .compile()
        .memory_analysis()
        .temp_size_in_bytes
    )


@pytest.mark.parametrize("causal", [False, True])
def test_planned_memory_grows_at_most_linearly_with_length(causal):
    """The O(N) promise, read off the compiled program: doubling N at most doubles the temporaries (10 %
    slack for the fixed part); the dense einsum path, whose N x N logits quadruple, shows the check bites."""
    grows = lambda impl: planned_temp_bytes(4096, impl, causal) / planned_temp_bytes(2048, impl, causal)
    assert grows("blockwise") <= 2.2
    assert grows("einsum") > 3.5
