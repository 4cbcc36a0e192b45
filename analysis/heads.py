"""Addressing heads: gate dicts, zeroing a head's W^O rows, and reading the sown attention weights.

A head is (kind, layer, head) with kind in `models.HEAD_MASK_KEYS`; per-kind arrays are
`[num_layers, num_heads]`, the layout `models.head_mask_variables` turns into the model's
`head_mask` collection.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from models import HEAD_MASK_KEYS, HEAD_MASK_MODULES as MODULES  # (stack, module) of each kind


def ones(config) -> dict[str, np.ndarray]:
    """All-open gates: {kind: [num_layers, num_heads] float32 ones}."""
    return {kind: np.ones((config.num_layers, config.num_heads), np.float32) for kind in HEAD_MASK_KEYS}


def mask_without(config, heads) -> dict[str, np.ndarray]:
    """Gates with the given (kind, layer, head)s closed (0) and every other head open (1)."""
    mask = ones(config)
    for kind, layer, head in heads:
        mask[kind][layer, head] = 0.0
    return mask


def zero_heads(params, mask: dict) -> dict:
    """Params whose W^O rows `[head, :, :]` are multiplied by the gates: a gate of 0 removes the head.

    W^O maps the concatenated head outputs to the model width, so scaling head h's rows is
    scaling its output; decoding code needs no mask argument for a pruned model.
    """
    params = jax.tree.map(lambda x: x, params)  # a fresh tree; leaves are replaced below
    for kind, gates in mask.items():
        stack, module = MODULES[kind]
        for layer, row in enumerate(np.asarray(gates)):
            out = params[stack][f"layer_{layer}"][module]["out"]
            out["kernel"] = out["kernel"] * row.astype(out["kernel"].dtype)[:, None, None]
    return params


def attention_weights(model, params, src, tgt_in) -> dict[str, np.ndarray]:
    """Teacher-forced weights {kind: [num_layers, B, H, Lq, Lk]} for src [B, Ls], tgt_in [B, Lt]."""
    return {k: np.asarray(v) for k, v in _weights_fn(model)(params, src, tgt_in).items()}


@functools.lru_cache(maxsize=8)
def _weights_fn(model):
    def weights(params, src, tgt_in):
        _, state = model.apply({"params": params}, src, tgt_in, mutable=["intermediates"])  # mutable: recorded
        sown = state["intermediates"]
        return {
            kind: jax.numpy.stack(
                [sown[stack][f"layer_{i}"][module]["attention_weights"][0] for i in range(model.config.num_layers)]
            )
            for kind, (stack, module) in MODULES.items()
        }

    return jax.jit(weights)
