"""Reuse, shown: a tiny decoder-only NNX LM on `attention.nnx.MultiHeadAttention`, and `nnx.bridge` with the Linen
Transformer."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import attention
from models.transformer import Transformer, TransformerConfig

VOCAB, D, MAX_LEN = 11, 32, 16


class Block(nnx.Module):
    def __init__(self, *, rngs):
        self.ln1, self.ln2 = nnx.LayerNorm(D, rngs=rngs), nnx.LayerNorm(D, rngs=rngs)
        self.attn = attention.nnx.MultiHeadAttention(4, D, num_kv_heads=2, rngs=rngs)
        self.up, self.down = nnx.Linear(D, 2 * D, rngs=rngs), nnx.Linear(2 * D, D, rngs=rngs)

    def __call__(self, x_BxLxD, decode, lengths):
        x_BxLxD = x_BxLxD + self.attn(self.ln1(x_BxLxD), is_causal=True, decode=decode, lengths=lengths)
        return x_BxLxD + self.down(jax.nn.gelu(self.up(self.ln2(x_BxLxD))))


class TinyLM(nnx.Module):
    """Pre-LN decoder-only LM with learned positions and tied logits."""

    def __init__(self, *, rngs):
        self.embed = nnx.Embed(VOCAB, D, rngs=rngs)
        self.pos = nnx.Embed(MAX_LEN, D, rngs=rngs)
        self.blocks = nnx.List([Block(rngs=rngs) for _ in range(2)])
        self.norm = nnx.LayerNorm(D, rngs=rngs)

    def __call__(self, tokens_BxL, decode=False, lengths=None):
        """Logits `[B, L, VOCAB]`; with `decode`, tokens go to each sequence's cache position."""
        L = tokens_BxL.shape[1]
        start_B = self.blocks[0].attn.cache_index[...] if decode else jnp.zeros(tokens_BxL.shape[:1], jnp.int32)
        positions_BxL = start_B[:, None] + jnp.arange(L, dtype=jnp.int32)[None, :]
        x_BxLxD = self.embed(tokens_BxL) + self.pos(jnp.minimum(positions_BxL, MAX_LEN - 1))
        for block in self.blocks:
            x_BxLxD = block(x_BxLxD, decode, lengths)
        return self.embed.attend(self.norm(x_BxLxD))


def counting_batch(key, batch=8, length=12):
    """Sequences that count up by one (mod VOCAB) from a random start: learnable in a few steps."""
    starts = jax.random.randint(key, (batch, 1), 0, VOCAB)
    return (starts + jnp.arange(length)[None, :]) % VOCAB


@nnx.jit
def train_step(model, optimizer, tokens_BxL):
    def loss_fn(model):
        logits = model(tokens_BxL[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens_BxL[:, 1:]).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


@nnx.jit
def decode_step(model, tokens_BxL, lengths_B):
    return model(tokens_BxL, decode=True, lengths=lengths_B)


@nnx.jit
def full_pass(model, tokens_BxL):
    return model(tokens_BxL)


def test_tiny_lm_trains_and_decodes_ragged_prompts_with_prefill():
    model = TinyLM(rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    losses = [float(train_step(model, optimizer, counting_batch(jax.random.key(step)))) for step in range(40)]
    assert losses[-1] < 0.5 * losses[0], losses

    prompts, lengths = jnp.array([[3, 4, 0, 0], [7, 8, 9, 10]]), np.array([2, 4])  # right-padded
    for block in model.blocks:
        block.attn.init_cache((2, MAX_LEN, D))
    logits = decode_step(model, prompts, jnp.asarray(lengths))
    next_B = jnp.argmax(logits[jnp.arange(2), lengths - 1], axis=-1)
    generated, steps = [next_B], 5
    for _ in range(steps - 1):
        next_B = jnp.argmax(decode_step(model, next_B[:, None], None)[:, 0], axis=-1)
        generated.append(next_B)
    generated = np.stack(generated, axis=1)

    # reference: greedy decoding by full causal passes over each growing sequence, no cache
    # (right-padded to MAX_LEN: one compile; causal, so the padding never reaches the read position)
    for b, n in enumerate(lengths):
        sequence = list(np.asarray(prompts[b, :n]))
        for _ in range(steps):
            padded = jnp.array([sequence + [0] * (MAX_LEN - len(sequence))])
            sequence.append(int(jnp.argmax(full_pass(model, padded)[0, len(sequence) - 1])))
        np.testing.assert_array_equal(generated[b], sequence[n:])
    np.testing.assert_array_equal(generated[0], [5, 6, 7, 8, 9])  # it learned to count


def test_bridge_runs_the_linen_transformer_as_an_nnx_module_and_trains_it():
    config = TransformerConfig(
        vocab_size=12, d_model=16, num_heads=4, num_kv_heads=2, num_layers=1, mlp_dim=32, max_len=16, dropout_rate=0.0
    )
    src, tgt = jnp.array([[5, 6, 7, 2, 0], [8, 9, 2, 0, 0]]), jnp.array([[1, 5, 6, 7], [1, 8, 9, 0]])
    model = nnx.bridge.lazy_init(nnx.bridge.ToNNX(Transformer(config), rngs=nnx.Rngs(0)), src, tgt)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    np.testing.assert_allclose(model(src, tgt), Transformer(config).apply({"params": params}, src, tgt), atol=1e-5)

    optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer):
        loss_fn = lambda m: optax.softmax_cross_entropy_with_integer_labels(m(src, tgt), src[:, :4]).mean()
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    assert float(step(model, optimizer)) > float(step(model, optimizer))


def test_bridge_puts_the_nnx_layer_inside_linen_with_the_linen_layers_params():
    class LinenBlock(nn.Module):
        @nn.compact
        def __call__(self, x):
            attend = nnx.bridge.to_linen(attention.nnx.MultiHeadAttention, 4, 16, num_kv_heads=2, name="attn")
            return x + attend(x, is_causal=True)

    x = jax.random.normal(jax.random.key(1), (2, 6, 16))
    variables = LinenBlock().init(jax.random.key(0), x)
    linen = attention.MultiHeadAttention(num_heads=4, num_kv_heads=2)
    np.testing.assert_allclose(
        LinenBlock().apply(variables, x),
        x + linen.apply({"params": variables["params"]["attn"]}, x, is_causal=True),
        atol=1e-5,
    )
