"""Several seeds of one config trained as one program: each train state stacked on a leading seed axis.

The step is `jax.vmap`-ed over that axis, so XLA compiles (and an accelerator launches) the kernels of one
model for all the seeds together; each seed keeps its own initialisation, batches (its own schedule) and
dropout key, and so trains exactly as it would alone (tests/training/parallel/test_stacked.py). The seed
axis is a mesh axis of its own ("seed"), laid over the devices with no collective across it; what devices
remain split each seed's batch ("data"). A seed can be stopped alone (`active`): from then on its state is
left as it was while the others go on.

Shapes: a stacked state's every leaf is [seeds, ...]; a stacked batch's every array [seeds, rows, length].
"""

from __future__ import annotations

import functools
import logging
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import backends
from training.core import step as step_lib
from training.parallel import sharding

SEED = "seed"  # the mesh axis the stacked seeds are laid over


def layout(seeds: int, devices: int) -> tuple[int, int]:
    """(seed shards, data shards) for `seeds` stacked seeds on `devices` devices: as many devices a seed axis
    shard as divide both (8 seeds on 8 devices: one each; 16 on 8: two seeds a device; 4 on 8: two devices a
    seed, which split its batch), every device used."""
    if seeds < 1 or devices < 1:
        raise ValueError(f"stacked seeds = {seeds} on {devices} devices; expected at least one of each")
    shards = math.gcd(seeds, devices)
    return shards, devices // shards


def idle_devices(rows: int, seed_shards: int, data: int) -> int:
    """Devices of a (seed, data) mesh that hold only padding rows: each seed's `rows` split over `data` devices as
    `sharding.padded_rows` pads them (ceil(rows / data) a device)."""
    a_device = -(-rows // data)
    return (data - -(-rows // a_device)) * seed_shards


def idle_note(seeds: int, devices: int, rows: int) -> str | None:
    """The one line that says a stack leaves devices holding only padding rows (it still runs), or None."""
    seed_shards, data = layout(seeds, devices)
    idle = idle_devices(rows, seed_shards, data)
    if not idle:
        return None
    return (
        f"{seeds} stacked seed(s) on {devices} devices split each seed's {rows} rows over {data} devices: {idle} of "
        f"the {devices} hold only padding rows (they run, computing nothing of use; stack more seeds a device)"
    )


def make_mesh(seeds: int, devices=None) -> Mesh:
    """A (seed, data) mesh over `devices` (default: all) for `seeds` stacked seeds (`layout`)."""
    devices = list(jax.devices() if devices is None else devices)
    seed_shards, data = layout(seeds, len(devices))
    if data > 1:
        logging.info(
            "%d stacked seeds on %d devices: %d seed shards, each seed's batch split over %d devices",
            seeds,
            len(devices),
            seed_shards,
            data,
        )
    return Mesh(np.array(devices).reshape(seed_shards, data), (SEED, sharding.DATA))


def stack(trees: list) -> object:
    """Pytrees of one structure (one a seed) as one with a leading seed axis."""
    return jax.tree.map(lambda *leaves: np.stack(leaves), *trees)


def unstack(tree, seeds: int) -> list:
    """A stacked pytree's per-seed pytrees (host copies)."""
    host = jax.device_get(tree)
    return [jax.tree.map(lambda leaf, i=i: leaf[i], host) for i in range(seeds)]


class StackedTrainer:
    """`seeds` runs of one model and optimizer as one jitted, vmapped step on a (seed, data) mesh."""

    def __init__(self, model, tx, label_smoothing: float, seeds: int, devices=None):
        self.model, self.tx, self.seeds = model, tx, seeds
        self.mesh = make_mesh(seeds, devices)
        self.state_sharding = NamedSharding(self.mesh, P(SEED))  # every leaf [seeds, ...], seeds over the seed axis
        self.batch_sharding = NamedSharding(self.mesh, P(SEED, sharding.DATA))
        platform = backends.platform_of(model)
        step = functools.partial(
            step_lib.train_step, label_smoothing=label_smoothing, pick=backends.target_logits(platform)
        )

        def compiled(grad_norm: bool):
            def masked(state, batch, rng, active):
                """One seed's step; where the seed is stopped (`active` False) its state stays as it was."""
                new, metrics = step(state, batch, rng, grad_norm=grad_norm)
                return jax.tree.map(lambda n, o: jnp.where(active, n, o), new, state), metrics

            return jax.jit(
                jax.vmap(masked),
                in_shardings=(self.state_sharding, self.batch_sharding, self.state_sharding, self.state_sharding),
                out_shardings=(self.state_sharding, self.state_sharding),
                donate_argnums=0,
            )

        # as the single-run trainers: the gradient norm in every step on XLA:CPU, else only in the logged steps'
        self.logged_step_fn = compiled(grad_norm=True)
        self.step_fn = self.logged_step_fn if backends.grad_norm_every_step(platform) else compiled(grad_norm=False)

    def abstract_state(self, batch) -> object:
        """Shapes, dtypes and shardings of the stacked train state (nothing computed): what a compile needs."""
        create = functools.partial(step_lib.create_state, self.model, self.tx, batch=batch)
        abstract = jax.eval_shape(jax.vmap(create), jax.random.split(jax.random.key(0), self.seeds))
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=self.state_sharding), abstract)

    def init_state(self, rngs: jax.Array, batch) -> object:
        """The stacked train state: seed i's parameters from `rngs[i]`, as `step.create_state` makes one run's
        (`batch`: one seed's, for its shapes)."""
        if rngs.shape != (self.seeds,):
            raise ValueError(f"init rngs have shape {rngs.shape}; expected one key a seed, ({self.seeds},)")
        create = functools.partial(step_lib.create_state, self.model, self.tx, batch=batch)
        return jax.jit(jax.vmap(create), out_shardings=self.state_sharding)(rngs)

    def put_batch(self, batches: list[dict]) -> dict:
        """One batch a seed ({name: [rows, length]} each, equal shapes) -> the stacked device batch."""
        shapes = {name: {np.shape(b[name]) for b in batches} for name in batches[0]}
        if len(batches) != self.seeds or any(len(s) != 1 for s in shapes.values()):
            raise ValueError(
                f"stacked batches: {len(batches)} of shapes {shapes}; expected {self.seeds} of one shape "
                "(stacking needs fixed shapes: packed rows, data.pack_length > 0)"
            )
        data = self.mesh.shape[sharding.DATA]
        return {
            name: jax.device_put(
                np.stack([sharding.pad_rows(np.asarray(b[name]), data) for b in batches]), self.batch_sharding
            )
            for name in batches[0]
        }

    def compile(self, state, batch, rngs) -> int:
        """Compile both steps for these (abstract or real) arguments ahead of time, and use those programs from now
        on: returns the larger one's memory a device needs in bytes (arguments + outputs - donated + temporaries +
        code), as `training.run.aot` counts it, so a run can refuse seeds that will not fit before it trains."""
        active = jax.ShapeDtypeStruct((self.seeds,), jnp.bool_, sharding=self.state_sharding)
        one = self.step_fn is self.logged_step_fn  # XLA:CPU: one step for both
        self.logged_step_fn = self.logged_step_fn.lower(state, batch, rngs, active).compile()
        self.step_fn = self.logged_step_fn if one else self.step_fn.lower(state, batch, rngs, active).compile()
        needs = []
        for compiled in {id(f): f for f in (self.logged_step_fn, self.step_fn)}.values():
            memory = compiled.memory_analysis()
            if memory is not None:
                needs.append(
                    memory.argument_size_in_bytes
                    + memory.output_size_in_bytes
                    - memory.alias_size_in_bytes
                    + memory.temp_size_in_bytes
                    + memory.generated_code_size_in_bytes
                )
        return max(needs, default=0)

    def step(self, state, batch, rngs, active=None, logged: bool = True):
        """One step of every seed; `active` [seeds] bool (default all): a stopped seed's state is kept as it was;
        `logged`: this step's metrics hold the gradient norm. Returns (the new stacked state, metrics {name:
        [seeds]})."""
        active = jnp.ones((self.seeds,), bool) if active is None else jnp.asarray(active, bool)
        return (self.logged_step_fn if logged else self.step_fn)(state, batch, rngs, active)
