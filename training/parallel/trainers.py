"""How the train step runs on the devices: `jax.jit` over a (data, model) mesh, or `jax.pmap` data parallelism.

Both trainers share `step.train_step` and the same interface, so the loop does not branch:
`init_state`, `put_batch` (host batch -> device batch; `local_rows` / `put_local_batch`: a process's own rows
of it), `step`, `to_checkpoint` /
`from_checkpoint` (the state orbax sees), and `local_params` (an unsharded copy on this
process's first device, for evaluation and decoding). `step_fn` is the jitted (or pmapped)
function itself, for inspection: bench/scaling.py lowers it to count its collectives.
"""

from __future__ import annotations

import functools
import logging

import jax
import numpy as np
from flax import jax_utils
from jax.experimental import multihost_utils

import backends
from training.core import step as step_lib
from training.parallel import sharding

PMAP_AXIS = "batch"
_details = logging.getLogger(__name__)  # per-parameter lines: DEBUG, shown with train.py --verbose


def make_trainer(config, model, tx, devices=None):
    """The trainer `config.parallelism` names, its mesh/devices checked before anything compiles."""
    if config.parallelism == "pmap":
        return PmapTrainer(model, tx, config.optimizer.label_smoothing, devices)
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.model, devices)
    sharding.check_model_shards(mesh.shape[sharding.MODEL], config.model.num_heads, config.model.mlp_dim)
    return MeshTrainer(mesh, model, tx, config.optimizer.label_smoothing, config.mesh.shard_embeddings)


def local_copy(tree):
    """Host the full value of every (possibly multi-process) array, then put it on this process's first device."""
    host = jax.device_get(tree) if jax.process_count() == 1 else multihost_utils.process_allgather(tree, tiled=True)
    return jax.device_put(host, jax.local_devices()[0])


class MeshTrainer:
    """The step `jax.jit`-ed with explicit shardings: state by `sharding`'s rules, batch over `data`."""

    def __init__(self, mesh, model, tx, label_smoothing: float, shard_embeddings: bool):
        self.mesh, self.model, self.tx, self.shard_embeddings = mesh, model, tx, shard_embeddings
        self.data_shards = mesh.shape[sharding.DATA]
        self.label_smoothing = label_smoothing
        self.shardings = None  # known once the state's shapes are (init_state)

    def abstract_state(self, rng, batch):
        """Shapes, dtypes and shardings of the train state (nothing computed); sets up `step_fn`."""
        abstract = jax.eval_shape(functools.partial(step_lib.create_state, self.model, self.tx, batch=batch), rng)
        self.shardings = sharding.state_shardings(abstract, self.mesh, self.shard_embeddings)
        replicated = sharding.replicated(self.mesh)
        self.step_fn, self.logged_step_fn = _steps(
            self.model,
            lambda step: jax.jit(
                step,
                in_shardings=(self.shardings, sharding.batch_sharding(self.mesh), replicated),
                out_shardings=(self.shardings, replicated),
                donate_argnums=0,
            ),
            label_smoothing=self.label_smoothing,
        )
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, self.shardings)

    def init_state(self, rng, batch):
        """The train state created directly in its shards (no device ever holds all of it)."""
        abstract = self.abstract_state(rng, batch)
        logging.info("%s", sharding.describe(_kv_heads(self.model), self.mesh))
        for line in sharding.describe_params(abstract.params, self.shardings.params):
            _details.debug("%s", line)
        create = functools.partial(step_lib.create_state, self.model, self.tx, batch=batch)
        return jax.jit(create, in_shardings=sharding.replicated(self.mesh), out_shardings=self.shardings)(rng)

    def put_batch(self, batch: dict) -> dict:
        return sharding.put_batch(batch, self.mesh)

    def local_rows(self, rows: int) -> tuple[int, int]:
        """The rows of a batch of `rows` this process assembles (`sharding.local_rows`)."""
        return sharding.local_rows(self.mesh, rows)

    def put_local_batch(self, batch: dict, rows: int) -> dict:
        """This process's rows (`local_rows`) of a batch of `rows` -> the step's device batch."""
        return sharding.put_local_batch(batch, self.mesh, rows)

    def step(self, state, batch, rng, logged: bool = True):
        """One step; `logged`: the loop logs this step (its metrics then hold the gradient norm)."""
        return (self.logged_step_fn if logged else self.step_fn)(state, batch, rng)

    def to_checkpoint(self, state):
        return state

    def from_checkpoint(self, state):
        return state

    def local_params(self, params):
        return local_copy(params)


class PmapTrainer:
    """Data parallelism with `jax.pmap` over this process's devices: replicated state, summed gradients."""

    def __init__(self, model, tx, label_smoothing: float, devices=None):
        if jax.process_count() > 1:
            raise ValueError("config.parallelism = 'pmap' runs in one process; use 'jit' for multi-host runs")
        self.devices = list(devices if devices is not None else jax.local_devices())
        self.model, self.tx = model, tx
        self.data_shards = len(self.devices)
        self.step_fn, self.logged_step_fn = _steps(
            model,
            lambda step: jax.pmap(
                step, axis_name=PMAP_AXIS, in_axes=(0, 0, None), devices=self.devices, donate_argnums=0
            ),
            label_smoothing=label_smoothing,
            axis_name=PMAP_AXIS,
        )

    def init_state(self, rng, batch):
        state = jax.jit(functools.partial(step_lib.create_state, self.model, self.tx, batch=batch))(rng)
        logging.info("pmap data parallelism over %d devices; parameters replicated", len(self.devices))
        return self.from_checkpoint(state)

    def put_batch(self, batch: dict) -> dict:
        """[rows, L] -> [devices, rows / devices, L] (rows padded with empty ones to a multiple)."""
        n = len(self.devices)
        return {
            k: (a := sharding.pad_rows(np.asarray(v), n)).reshape(n, a.shape[0] // n, *a.shape[1:])
            for k, v in batch.items()
        }

    def local_rows(self, rows: int) -> tuple[int, int]:
        """One process: every row."""
        return 0, rows

    def put_local_batch(self, batch: dict, rows: int) -> dict:
        return self.put_batch(batch)

    def step(self, state, batch, rng, logged: bool = True):
        state, metrics = (self.logged_step_fn if logged else self.step_fn)(state, batch, rng)
        return state, jax.tree.map(lambda x: x[0], metrics)

    def to_checkpoint(self, state):
        return jax.tree.map(lambda x: x[0], state)

    def from_checkpoint(self, state):
        return jax_utils.replicate(state, self.devices)

    def local_params(self, params):
        return jax.device_put(jax.tree.map(lambda x: x[0], params), self.devices[0])


def _steps(model, compile_step, **settings):
    """(the step for unlogged steps, the step for logged ones), each `compile_step(train_step with settings)`: one
    program, the gradient norm in it, on XLA:CPU; two elsewhere, the norm only in the logged steps' program
    (`backends.grad_norm_every_step`). The loss's pick of the targets' logits is the model's platform's."""
    platform = backends.platform_of(model)
    step = functools.partial(step_lib.train_step, pick=backends.target_logits(platform), **settings)
    logged = compile_step(step)
    if backends.grad_norm_every_step(platform):
        return logged, logged
    return compile_step(functools.partial(step, grad_norm=False)), logged


def _kv_heads(model) -> int:
    return model.config.geometry.num_kv_heads
