"""The optimizer, the train state, and the pure train / eval step functions."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax import lax
from flax.training import train_state

from training.data.batching import PACKING_FIELDS


SCHEDULES = ("rsqrt", "cosine")


def learning_rate_schedule(opt, total_steps: int) -> optax.Schedule:
    """The learning rate per step, from `opt` (config.optimizer) and the run's `total_steps`.

    'rsqrt': peak * min(step / warmup, sqrt(warmup / step)), Vaswani's schedule with peak = (d_model * warmup)^-0.5.
    'cosine': linear warm-up to the peak, then a cosine decay that reaches 0 at `total_steps`, so a
    run of a fixed length ends annealed (the Table 3 preset's choice: its models end at their plateau).
    """
    if opt.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            0.0, opt.learning_rate, opt.warmup_steps, max(total_steps, opt.warmup_steps + 1)
        )
    if opt.schedule != "rsqrt":
        raise ValueError(f"config.optimizer.schedule = {opt.schedule!r}; expected one of {SCHEDULES}")
    peak, warmup_steps = opt.learning_rate, opt.warmup_steps

    def schedule(count):
        step = jnp.maximum(count + 1, 1).astype(jnp.float32)
        return peak * jnp.minimum(step / warmup_steps, jnp.sqrt(warmup_steps / step))

    return schedule


def make_optimizer(opt, total_steps: int) -> optax.GradientTransformation:
    """Adam on `learning_rate_schedule(opt, total_steps)`, after global-norm clipping unless opt.grad_clip_norm is 0."""
    adam = optax.adam(learning_rate_schedule(opt, total_steps), b1=opt.b1, b2=opt.b2, eps=opt.eps)
    return optax.chain(optax.clip_by_global_norm(opt.grad_clip_norm), adam) if opt.grad_clip_norm else adam


def create_state(model, tx, rng, batch) -> train_state.TrainState:
    params = model.init(rng, batch.src, batch.tgt_in)["params"]
    return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)


def abstract_state(model, config) -> train_state.TrainState:
    """Shapes and dtypes of the train state (nothing computed): the target of a checkpoint restore."""
    tokens = jnp.ones((1, 2), jnp.int32)
    return jax.eval_shape(
        lambda: train_state.TrainState.create(
            apply_fn=model.apply,
            params=model.init(jax.random.key(0), tokens, tokens)["params"],
            tx=make_optimizer(config.optimizer, config.num_train_steps),
        )
    )


def parameter_count(params) -> int:
    return sum(x.size for x in jax.tree.leaves(params))


def target_logits(logits, targets):
    """logits [B, L, V] at the targets [B, L] -> [B, L], as a one-hot product picks them: a masked sum over V.

    Its gradient is a select, so XLA fuses it into the softmax's gradient and the logits' cast in one pass
    (a gather's gradient scatters into a [B, L, V] buffer of its own: results/peer_compiled.md). The plain
    form, for GPUs and TPUs; XLA:CPU gathers instead (`backends.target_logits`).
    """
    hit = lax.broadcasted_iota(targets.dtype, logits.shape, logits.ndim - 1) == targets[..., None]
    return jnp.sum(jnp.where(hit, logits, jnp.zeros((), logits.dtype)), axis=-1)


def token_losses(logits, targets, weights, label_smoothing, pick=None):
    """(smoothed cross-entropy sum, NLL sum, token count) over weighted positions. logits [B, L, V].

    With smoothed labels (1 - s) one_hot + s / V, the cross-entropy is (1 - s) NLL + s (lse - mean
    logit): written so, no [B, L, V] one-hot or log-softmax is materialised, in either pass.
    pick: how the targets' logits are read (`target_logits`'s signature; None: `target_logits`), the
    backend's choice (`backends.target_logits`): the same numbers either way.
    """
    logits = logits.astype(jnp.float32)
    log_normalizer = jax.nn.logsumexp(logits, axis=-1)
    nll = log_normalizer - (pick or target_logits)(logits, targets)
    smoothed = (1.0 - label_smoothing) * nll + label_smoothing * (log_normalizer - jnp.mean(logits, axis=-1))
    return jnp.sum(smoothed * weights), jnp.sum(nll * weights), jnp.sum(weights)


def packing_inputs(batch: dict) -> dict:
    """The packed-row arrays of a batch (`training.data.batching.PACKING_FIELDS`), as the model's keyword arguments."""
    return {name: batch[name] for name in PACKING_FIELDS if name in batch}


def train_step(
    state, batch, rng, *, label_smoothing: float, axis_name: str | None = None, pick=None, grad_norm: bool = True
) -> tuple[Any, dict]:
    """One optimizer step. `rng` is folded with the step, so a resumed run draws the same dropout.

    The loss is the token-weighted mean over the global batch, plus whatever the model sows into
    its `losses` collection (a regulariser such as the adaptive span's L1; nothing by default). Under `jax.jit`
    on a mesh the batch is one global array and this needs nothing more. Under `jax.pmap` (`axis_name` set) each device
    holds a slice: the token count is summed over devices first, so each device's loss is its share
    of the global mean and the global gradient is the sum (`psum`) of the devices' gradients; their
    dropout keys differ by device index. `pick`: `token_losses`'. `grad_norm`: whether the metrics hold the
    gradients' global norm (one reduction a parameter: the trainers leave it to the logged steps where that
    pays, `backends.grad_norm_every_step`).
    """
    dropout_rng = jax.random.fold_in(rng, state.step)
    count = jnp.sum(batch["weights"])
    if axis_name is not None:
        dropout_rng = jax.random.fold_in(dropout_rng, lax.axis_index(axis_name))
        count = lax.psum(count, axis_name)
    denominator = jnp.maximum(count, 1.0)

    def loss_fn(params):
        logits, sown = state.apply_fn(
            {"params": params},
            batch["src"],
            batch["tgt_in"],
            train=True,
            rngs={"dropout": dropout_rng},
            mutable=["losses"],
            **packing_inputs(batch),
        )
        loss_sum, nll_sum, _ = token_losses(logits, batch["tgt_out"], batch["weights"], label_smoothing, pick)
        loss = loss_sum / denominator
        # terms the modules sow into `losses` (e.g. attention.family.span's L1 on its spans); none by default
        if terms := jax.tree.leaves(sown):
            regulariser = sum(jnp.sum(x) for x in terms)
            if axis_name is not None:  # each device sows the whole term, and the losses are summed over devices
                regulariser = regulariser / lax.psum(1, axis_name)
            loss = loss + regulariser
        return loss, nll_sum

    (loss, nll_sum), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    if axis_name is not None:
        loss, nll_sum, grads = lax.psum((loss, nll_sum, grads), axis_name)
    new_state = state.apply_gradients(grads=grads)
    metrics = {"loss": loss, "nll": nll_sum / denominator, "tokens": count}
    if grad_norm:
        metrics["grad_norm"] = optax.tree.norm(grads)
    return new_state, metrics


def eval_step(params, batch, *, apply_fn, pick=None) -> dict:
    """Sums for dev loss/perplexity: NLL (no smoothing) and token count. `pick`: `token_losses`'."""
    logits = apply_fn({"params": params}, batch["src"], batch["tgt_in"], train=False, **packing_inputs(batch))
    _, nll_sum, count = token_losses(logits, batch["tgt_out"], batch["weights"], 0.0, pick)
    return {"nll_sum": nll_sum, "tokens": count}
