"""bench.decode's cache size: every cached array of a (possibly nested) member cache, never its write index."""

import math

import jax
import jax.numpy as jnp

import attention
from bench.decode import cache_bytes


def cache_of(attention_type: str, length: int):
    layer = attention.MultiHeadAttention(num_heads=2, decode=True, attention_type=attention_type)
    return jax.jit(layer.init)(jax.random.key(0), jnp.ones((3, length, 16)))["cache"]


def test_cache_bytes_counted_by_hand_for_flat_and_nested_caches():
    # batch 3, 2 heads of d_k = d_v = 8, float32; by hand from each method's definition:
    assert cache_bytes(cache_of("softmax", 5)) == 2 * 3 * 2 * 5 * 8 * 4  # K and V: [B, G, L, d]
    assert cache_bytes(cache_of("mla", 5)) == 3 * 5 * 32 * 4  # latent [B, L, d_c = 4 d_k]
    m = round(8 * math.log(8))  # performer's default m = round(d_k ln d_k) = 17
    performer = cache_bytes(cache_of("performer", 5))
    assert performer == 3 * 2 * m * (8 + 2) * 4  # numerator [.., m, d_v], denominator and shift [.., m]
    assert cache_bytes(cache_of("performer", 50)) == performer  # a fixed state: no length in it
