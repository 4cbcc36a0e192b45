"""Michel et al. (2019) head importance: I_h = E_x |dL(x)/d xi_h| through the `head_mask` gates.

Each sentence gets its own gates (`[num_layers, B, H]`, all 1), so one backward pass gives every
sentence's gradient and the absolute value is taken per sentence, as the expectation asks.
L(x) is the sentence's summed token NLL (no label smoothing); the sum over sentences is divided
by the number of target tokens. Scores are then divided by their L2 norm within each layer
(Michel et al.'s per-layer normalisation), which makes them comparable across layers.
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from analysis import tables
from models import HEAD_MASK_KEYS, head_mask_variables
from training.core import step as step_lib
from training.data.batching import dev_batches


def raw_importance(model, params, batches) -> dict[str, np.ndarray]:
    """{kind: [num_layers, H]} mean over target tokens of |dL(x)/d xi_h| summed over sentences, unnormalised."""
    grad_fn = _gate_gradients(model)
    total = {k: 0.0 for k in HEAD_MASK_KEYS}
    tokens = 0.0
    for batch in batches:
        grads = grad_fn(params, batch)
        for kind in HEAD_MASK_KEYS:
            total[kind] = total[kind] + np.abs(np.asarray(grads[kind])).sum(axis=1)  # sum over sentences
        tokens += float(np.sum(batch["weights"]))
    return {k: v / max(tokens, 1.0) for k, v in total.items()}


def normalise_per_layer(scores: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each layer's scores divided by their L2 norm (a layer of zeros stays zero)."""
    return {k: v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-20) for k, v in scores.items()}


def head_importance(run, corpus) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(raw, per-layer-normalised) importance {kind: [num_layers, H]} over `corpus` (teacher-forced references)."""
    raw = raw_importance(run.model, run.params, dev_batches(run.config, run.vocab, corpus))
    return raw, normalise_per_layer(raw)


@functools.lru_cache(maxsize=8)
def _gate_gradients(model):
    cfg = model.config

    def sentence_losses(gates, params, batch):
        logits = model.apply({"params": params, **head_mask_variables(cfg, gates)}, batch["src"], batch["tgt_in"])
        _, nll_sum, _ = step_lib.token_losses(logits, batch["tgt_out"], batch["weights"], 0.0)
        return nll_sum  # the sum over sentences of each sentence's loss: its gradient is per sentence

    def gradients(params, batch):
        rows = batch["src"].shape[0]
        gates = {k: jnp.ones((cfg.num_layers, rows, cfg.num_heads), jnp.float32) for k in HEAD_MASK_KEYS}
        return jax.grad(sentence_losses)(gates, params, batch)

    return jax.jit(gradients)


def write(raw: dict, normalised: dict, csv_path: Path, md_path: Path) -> None:
    """One row per head (kind, layer, head, raw, normalised), and a markdown grid per kind."""
    rows = [
        {"kind": k, "layer": i, "head": h, "raw": float(raw[k][i, h]), "normalised": float(normalised[k][i, h])}
        for k in HEAD_MASK_KEYS
        for i in range(raw[k].shape[0])
        for h in range(raw[k].shape[1])
    ]
    tables.write(rows, ["kind", "layer", "head", "raw", "normalised"], csv_path=csv_path, digits=6)
    grid = [
        {"kind": k, "layer": i, **{f"head {h}": float(normalised[k][i, h]) for h in range(normalised[k].shape[1])}}
        for k in HEAD_MASK_KEYS
        for i in range(normalised[k].shape[0])
    ]
    tables.write(grid, list(grid[0]), md_path=md_path)
