"""Seeds stacked into one program train as each would alone: the same initial parameters, exactly, and each seed's
loss at every step within 1e-5 (relative) of its own run's; a stopped seed stays as it was."""

import functools

import jax
import numpy as np
import optax
import pytest

from configs import default
from models import Transformer
from tiny import model_config
from training.data.batching import BatchSchedule, as_arrays
from training.parallel import stacked, trainers

SEEDS = (3, 7, 11)
STEPS = 4


def _corpus(n=60, seed=0):
    rng = np.random.default_rng(seed)
    src = [list(rng.integers(4, 20, rng.integers(2, 7))) for _ in range(n)]
    tgt = [list(rng.integers(4, 20, rng.integers(2, 7))) for _ in range(n)]
    return src, tgt


def _schedule(seed):
    src, tgt = _corpus()
    return BatchSchedule(src, tgt, token_budget=64, bucket_lengths=(16,), seed=seed, pack_length=16)


def _model():
    return Transformer(model_config(d_model=16, num_heads=2, num_layers=1, mlp_dim=24, max_len=16, dropout_rate=0.1))


@functools.cache
def _trainer():
    """The training loop's trainer on one device (one for every seed: one compile)."""
    config = default.get_config()
    config.mesh.data = config.mesh.model = 1
    return trainers.make_trainer(config, _model(), optax.adam(1e-2), jax.devices()[:1])


def _alone(seed):
    """Seed `seed` trained by the training loop's trainer on one device: initial parameters and losses."""
    schedule, trainer = _schedule(seed), _trainer()
    rng_params, rng_dropout = jax.random.split(jax.random.key(seed))
    state = trainer.init_state(rng_params, schedule.batch(0))
    initial = jax.device_get(state.params)
    losses = []
    for step in range(STEPS):
        state, metrics = trainer.step(state, trainer.put_batch(as_arrays(schedule.batch(step))), rng_dropout)
        losses.append(float(metrics["loss"]))
    return initial, losses


def _stacked(active=None):
    trainer = stacked.StackedTrainer(_model(), optax.adam(1e-2), 0.1, len(SEEDS), jax.devices()[:1])
    keys = [jax.random.split(jax.random.key(seed)) for seed in SEEDS]
    rng_params, rng_dropout = jax.numpy.stack([k[0] for k in keys]), jax.numpy.stack([k[1] for k in keys])
    schedules = [_schedule(seed) for seed in SEEDS]
    state = trainer.init_state(rng_params, schedules[0].batch(0))
    initial = stacked.unstack(state.params, len(SEEDS))
    losses = []
    for step in range(STEPS):
        batch = trainer.put_batch([as_arrays(s.batch(step)) for s in schedules])
        state, metrics = trainer.step(state, batch, rng_dropout, active)
        losses.append(np.asarray(metrics["loss"]))
    return initial, np.array(losses).T, state


def test_stacked_seeds_train_as_each_alone():
    initial, losses, _ = _stacked()
    for i, seed in enumerate(SEEDS):
        alone_initial, alone_losses = _alone(seed)
        jax.tree.map(np.testing.assert_array_equal, initial[i], alone_initial)
        np.testing.assert_allclose(losses[i], alone_losses, rtol=1e-5)
    assert len({round(float(row[0]), 4) for row in losses}) == len(SEEDS)  # the seeds' own data and init differ


def test_a_stopped_seed_keeps_its_state_while_the_others_train():
    initial, _, state = _stacked(active=[True, False, True])
    kept = stacked.unstack(state, len(SEEDS))
    jax.tree.map(np.testing.assert_array_equal, kept[1].params, initial[1])  # seed 7 never moved
    assert int(kept[1].step) == 0 and int(kept[0].step) == int(kept[2].step) == STEPS
    with pytest.raises(AssertionError):
        jax.tree.map(np.testing.assert_array_equal, kept[0].params, initial[0])


@pytest.mark.parametrize("seeds, devices, expected", [(8, 8, (8, 1)), (16, 8, (8, 1)), (4, 8, (4, 2)), (3, 2, (1, 2))])
def test_the_seed_axis_uses_every_device(seeds, devices, expected):
    assert stacked.layout(seeds, devices) == expected
