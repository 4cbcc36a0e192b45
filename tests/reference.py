"""Independent NumPy (float64) attention, written from the formula, for the tests to compare against."""

import numpy as np


def softmax(logits):
    logits = logits - logits.max(axis=-1, keepdims=True)
    weights = np.exp(logits)
    return weights / weights.sum(axis=-1, keepdims=True)


def attention(q, k, v, mask=None, bias=None):
    """q [..., Lq, H, Dk], k [..., Lk, G, Dk], v [..., Lk, G, Dv] -> (out [..., Lq, H, Dv], weights [..., H, Lq, Lk]).

    K/V heads are repeated H/G times (query head h uses KV head h // (H/G)). Fully masked
    rows get uniform weights (the convention the library documents).
    """
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    repeat = q.shape[-2] // k.shape[-2]
    k, v = np.repeat(k, repeat, axis=-2), np.repeat(v, repeat, axis=-2)
    logits = np.einsum("...qhd,...khd->...hqk", q, k) / np.sqrt(q.shape[-1])
    if bias is not None:
        logits = logits + bias
    if mask is not None:
        mask = np.broadcast_to(mask, logits.shape)
        logits = np.where(mask, logits, -np.inf)
        logits = np.where(mask.any(axis=-1, keepdims=True), logits, 0.0)  # fully masked -> uniform
    weights = softmax(logits)
    return np.einsum("...hqk,...khd->...qhd", weights, v), weights
