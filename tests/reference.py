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


def attention_grads(q, k, v, d_out, mask=None, bias=None, keep=None):
    """Gradients (dq, dk, dv) of `sum(out * d_out)` for `attention`, from the softmax's Jacobian.

    `keep`, broadcastable to the weights `[..., H, Lq, Lk]`, is a dropout multiplier applied
    to the weights before V (keep / keep_prob). Masked logits pass no gradient.
    """
    q, k, v, d_out = (np.asarray(x, np.float64) for x in (q, k, v, d_out))
    _, weights = attention(q, k, v, mask=mask, bias=bias)
    dropped = weights if keep is None else weights * keep
    repeat = q.shape[-2] // k.shape[-2]
    k_rep, v_rep = np.repeat(k, repeat, axis=-2), np.repeat(v, repeat, axis=-2)
    d_dropped = np.einsum("...qhd,...khd->...hqk", d_out, v_rep)
    d_weights = d_dropped if keep is None else d_dropped * keep
    d_logits = weights * (d_weights - (d_weights * weights).sum(axis=-1, keepdims=True))
    if mask is not None:
        d_logits = np.where(np.broadcast_to(mask, d_logits.shape), d_logits, 0.0)
    scale = 1.0 / np.sqrt(q.shape[-1])
    dq = np.einsum("...hqk,...khd->...qhd", d_logits, k_rep) * scale
    dk_rep = np.einsum("...hqk,...qhd->...khd", d_logits, q) * scale
    dv_rep = np.einsum("...hqk,...qhd->...khd", dropped, d_out)
    group = lambda x: x.reshape(*x.shape[:-2], k.shape[-2], repeat, x.shape[-1]).sum(axis=-2)
    return dq, group(dk_rep), group(dv_rep)
