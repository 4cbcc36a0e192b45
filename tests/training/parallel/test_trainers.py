"""The trainers' two steps: on a GPU or TPU the gradient norm only in the logged steps' program, on XLA:CPU one
program with it; both the training loop's step otherwise (the same loss and update)."""

import jax
import numpy as np
import optax
import pytest

from attention import Formulation
from backends import xla_cpu
from configs import default
from models import Transformer
from tiny import model_config
from training.data.batching import BatchSchedule, as_arrays
from training.parallel import trainers


def _trainer(formulation):
    config = default.get_config()
    config.parallelism, config.mesh.data, config.mesh.model = "jit", 1, 1
    model = Transformer(
        model_config(d_model=16, num_heads=2, num_layers=1, mlp_dim=24, max_len=8, formulation=formulation)
    )
    return trainers.make_trainer(config, model, optax.sgd(0.1), jax.devices()[:1])


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_on_an_accelerator_only_the_logged_step_computes_the_gradient_norm(platform):
    batch = BatchSchedule.assemble([[5, 6, 7], [10, 11]], [[8, 9], [12, 13, 14]], rows=2, length=4)
    trainer = _trainer(Formulation(platform))
    state = trainer.abstract_state(jax.random.key(0), batch)
    arrays, rng = as_arrays(batch), jax.random.key(1)
    plain = jax.eval_shape(trainer.step_fn, state, arrays, rng)[1]
    logged = jax.eval_shape(trainer.logged_step_fn, state, arrays, rng)[1]
    assert "grad_norm" not in plain and "grad_norm" in logged and set(logged) - set(plain) == {"grad_norm"}


def test_on_the_cpu_one_step_computes_it_every_time_and_the_two_platforms_agree():
    batch = BatchSchedule.assemble([[5, 6, 7], [10, 11]], [[8, 9], [12, 13, 14]], rows=2, length=4)
    cpu, gpu = _trainer(xla_cpu.FORMULATION), _trainer(Formulation("cuda"))  # the second traced for a GPU, run here
    arrays, rng = as_arrays(batch), jax.random.key(1)
    found = {}
    for name, trainer, logged in (("cpu", cpu, False), ("gpu unlogged", gpu, False), ("gpu logged", gpu, True)):
        state = trainer.init_state(jax.random.key(0), batch)  # the same parameters each time
        found[name] = trainer.step(state, trainer.put_batch(arrays), rng, logged)[1]
    assert cpu.step_fn is cpu.logged_step_fn and gpu.step_fn is not gpu.logged_step_fn
    assert "grad_norm" in found["cpu"] and "grad_norm" not in found["gpu unlogged"]
    # the same loss and gradient norm: only the loss's reading of the targets' logits differs (gather / masked sum)
    np.testing.assert_allclose(float(found["gpu logged"]["grad_norm"]), float(found["cpu"]["grad_norm"]), rtol=1e-5)
    for name in ("gpu unlogged", "gpu logged"):
        np.testing.assert_allclose(float(found[name]["loss"]), float(found["cpu"]["loss"]), rtol=1e-6)
