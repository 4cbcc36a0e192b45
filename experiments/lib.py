"""What the experiments share: each family member's settings at length N, the small encoder, its training loop.

`experiments.associative_recall` (long-range lookup) and `experiments.masked_lm` (Linformer's
perplexity claim) train the same model per attention-family member from the same seed, so that a
difference between members is the attention's alone. `bench/attention_family.py` times the members
at the same settings (`member_options`), so its speed and memory rows and these tasks' quality rows
describe one configuration.
"""

from __future__ import annotations

import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import attention
from models.transformer import sinusoidal_positions

WIDTH, HEADS, LAYERS = 64, 4, 2


def member_options(name: str, N: int) -> dict:
    """Each member's settings at length N: the papers' defaults where they give one."""
    return {
        "linformer": dict(max_length=N, projected_length=256),  # the paper's k for long N
        "performer": dict(num_features=256),  # ~ d ln d
        # BigBird-ITC; below N = 1024 the blocks shrink so a row keeps 16 (else its 8 seen blocks would cover it)
        "bigbird": dict(block_size=min(64, N // 16), window_blocks=1, global_blocks=2, random_blocks=3),
        "lsh": dict(num_buckets=max(2, 2 * (N // 128)), chunk_length=64, num_hashes=2),  # ~2 chunks per bucket
        "entmax": dict(),
        "span": dict(max_span=256, ramp=32, impl="blockwise"),
    }[name]


class Encoder(nn.Module):
    """Tokens `[B, N]` -> logits `[B, N, vocab]`: pre-LN blocks of `attention_type` attention and an MLP.

    `positions`: "learned" (a small random table: recall needs content, not place) or "sinusoidal"
    (Vaswani's, beside embeddings scaled by √width: a masked LM needs its neighbours, and a learned
    table starting at 0.02 left it at unigram perplexity after 2,000 steps).
    """

    vocab_size: int
    length: int
    attention_type: str
    attention_options: dict | None = None
    impl: str = "vmap"
    positions: str = "learned"

    @nn.compact
    def __call__(self, tokens):
        if self.positions not in ("learned", "sinusoidal"):
            raise ValueError(f"positions must be 'learned' or 'sinusoidal', got {self.positions!r}")
        x = nn.Embed(self.vocab_size, WIDTH)(tokens)
        if self.positions == "learned":
            x = x + self.param("positions", nn.initializers.normal(0.02), (self.length, WIDTH))[None]
        else:
            x = x * WIDTH**0.5 + sinusoidal_positions(self.length, WIDTH)[None]
        for i in range(LAYERS):
            x = x + attention.MultiHeadAttention(
                num_heads=HEADS,
                attention_type=self.attention_type,
                attention_options=self.attention_options,
                impl=self.impl,
                name=f"attention_{i}",
            )(nn.LayerNorm()(x))
            h = nn.Dense(4 * WIDTH)(nn.LayerNorm()(x))
            x = x + nn.Dense(WIDTH)(nn.gelu(h))
        return nn.Dense(self.vocab_size)(nn.LayerNorm()(x))


def member_encoder(
    attention_type: str, options: dict, vocab_size: int, length: int, positions: str = "learned"
) -> Encoder:
    """The encoder with `attention_type` set by `options` (as `member_options` gives them)."""
    options = dict(options)
    impl = options.pop("impl", "vmap")  # a layer setting, which the layer passes on to the member
    return Encoder(vocab_size, length, attention_type, options or None, impl, positions)


def masked_loss(logits, targets, scored):
    """Mean cross-entropy over the `scored` positions. logits `[B, N, V]`; targets, scored `[B, N]`."""
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return jnp.sum(losses * scored) / jnp.sum(scored)


def fit(model: Encoder, params, next_batch, steps: int, learning_rate: float, lr_scales: dict | None = None):
    """AdamW with linear warm-up (a tenth of `steps`) and cosine decay; `next_batch()` -> (tokens, targets, scored).

    `lr_scales`: {parameter name: factor} multiplies the learning rate of every parameter so named
    (e.g. {"E": 0.0, "F": 0.0} freezes Linformer's projections; AdamW moves every entry at about the
    learning rate whatever its gradient's size). Returns the trained params, the loss of every step
    and this process's CPU seconds spent.
    """
    optimizer = optax.adamw(optax.warmup_cosine_decay_schedule(0.0, learning_rate, steps // 10, steps))
    opt_state = optimizer.init(params)
    scales = lr_scales or {}
    scale = lambda path, update: update * scales.get(getattr(path[-1], "key", None), 1.0)

    @jax.jit
    def step(params, opt_state, tokens, targets, scored):
        loss, grads = jax.value_and_grad(lambda p: masked_loss(model.apply(p, tokens), targets, scored))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        updates = jax.tree_util.tree_map_with_path(scale, updates)
        return optax.apply_updates(params, updates), opt_state, loss

    start, losses = time.process_time(), []
    for _ in range(steps):
        params, opt_state, loss = step(params, opt_state, *next_batch())
        losses.append(float(loss))
    return params, losses, time.process_time() - start


def evaluate(model: Encoder, params, batches) -> dict:
    """Accuracy (argmax) and mean cross-entropy over the scored positions of `batches` of (tokens, targets, scored)."""

    @jax.jit
    def sums(params, tokens, targets, scored):
        logits = model.apply(params, tokens)
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
        right = (jnp.argmax(logits, axis=-1) == targets) & scored
        return jnp.sum(right), jnp.sum(losses * scored), jnp.sum(scored)

    right = loss = total = 0.0
    for tokens, targets, scored in batches:
        r, l, n = sums(params, tokens, targets, scored)
        right, loss, total = right + float(r), loss + float(l), total + float(n)
    return {"accuracy": right / total, "loss": loss / total, "scored": int(total)}


def final_loss(losses) -> float:
    """The mean training loss over the last twentieth of the steps (one step's loss is noisy)."""
    return float(np.mean(losses[-max(1, len(losses) // 20) :]))
