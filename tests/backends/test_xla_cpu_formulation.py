"""XLA:CPU's attention spellings (`backends.xla_cpu.FORMULATION`) against NumPy and the plain formulation.

Its products are the plain ones (one 16-bit query per KV head, few queries against many keys, GQA
rows and square blocks all equal NumPy's and the plain formulation's), and the cache barrier of a
decode step leaves output and cache equal to the plain layer's.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention
from backends import xla_cpu
from reference import attention as reference

CPU = xla_cpu.FORMULATION


def _inputs(Lq, Lk, H, G, dtype, seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(keys[0], (2, Lq, H, 8))
    k = jax.random.normal(keys[1], (2, Lk, G, 8))
    v = jax.random.normal(keys[2], (2, Lk, G, 8))
    return tuple(x.astype(dtype) for x in (q, k, v))


@pytest.mark.parametrize(
    "Lq, Lk, H, G",
    [(1, 64, 4, 4), (2, 64, 4, 4), (1, 64, 4, 2), (16, 16, 4, 4)],
    ids=["one-row", "few-queries", "gqa-rows", "square"],
)
@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 2e-5), (jnp.bfloat16, 2e-2)])
def test_cpu_spelling_equals_numpy_and_plain(Lq, Lk, H, G, dtype, tol):
    q, k, v = _inputs(Lq, Lk, H, G, dtype)
    mask = np.arange(Lk)[None, :] < np.array([[Lk - 3]]).T  # the last 3 keys masked
    with jax.default_matmul_precision("highest"):
        ours = attention.attend(q, k, v, mask=mask[:, None, None, :], formulation=CPU)[0]
        plain = attention.attend(q, k, v, mask=mask[:, None, None, :])[0]
    want, _ = reference(*(np.asarray(x.astype(jnp.float32)) for x in (q, k, v)), mask=mask[:, None, None, :])
    # bfloat16: both round the output to bfloat16 (a relative 2**-8) from float32 sums
    np.testing.assert_allclose(np.asarray(ours, np.float32), want, rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(ours, np.float32), np.asarray(plain, np.float32), rtol=tol, atol=tol)


@pytest.mark.parametrize("num_kv_heads", [4, 1])
def test_decode_step_with_the_cpu_formulation_equals_plain(num_kv_heads):
    layer = lambda f: attention.MultiHeadAttention(
        num_heads=4,
        num_kv_heads=num_kv_heads,
        decode=True,
        formulation=f,
    )
    x = jax.random.normal(jax.random.key(3), (2, 6, 16))
    variables = layer(None).init(jax.random.key(0), x)
    outs = {}
    for name, f in (("plain", None), ("cpu", CPU)):
        cache, steps = variables["cache"], []
        for t in range(x.shape[1]):
            y, state = layer(f).apply(
                {"params": variables["params"], "cache": cache}, x[:, t : t + 1], mutable=["cache"]
            )
            cache, steps = state["cache"], [*steps, y]
        outs[name] = (np.concatenate(steps, axis=1), cache)
    np.testing.assert_allclose(outs["cpu"][0], outs["plain"][0], rtol=1e-5, atol=1e-6)
    for name in ("cached_key", "cached_value", "cache_index"):
        np.testing.assert_array_equal(outs["cpu"][1][name], outs["plain"][1][name])
    hlo = jax.jit(lambda v, t: layer(CPU).apply(v, t, mutable=["cache"])).lower(variables, x[:, :1]).as_text()
    assert "optimization_barrier" in hlo


def test_decode_log_probs_keep_the_logits_apart_and_equal_plain():
    logits = jax.random.normal(jax.random.key(4), (3, 11))
    barriers = lambda f: jax.jit(f.decode_log_probs).lower(logits).as_text().count("optimization_barrier")
    assert (barriers(CPU), barriers(attention.Formulation())) == (1, 0)
    np.testing.assert_array_equal(CPU.decode_log_probs(logits), jax.nn.log_softmax(logits))
    np.testing.assert_array_equal(attention.Formulation().decode_log_probs(logits), jax.nn.log_softmax(logits))
