"""Run by test_sharding.py in a subprocess with 8 fake CPU devices; prints one JSON object of measurements.

The device count is fixed when JAX's backend starts, so these checks cannot share the pytest
process. References are the plain single-device `jax.jit(train_step)`; the optimizer is the
project's Adam (eps raised, see
`make_config`) behind `optax.trace(decay=0)`, whose state then holds each step's exact gradient.
"""

import functools
import json
import sys
import tempfile

import jax
import numpy as np
import optax

from configs import default
from models import Transformer
from training import checkpoints, config as config_lib
from training.core import step as step_lib
from training.data.batching import Batch
from training.parallel import trainers

STEPS = 2
VOCAB = 64


def make_config(kv_heads, dropout, mesh=(1, 1), shard_embeddings=False, parallelism="jit"):
    config = default.get_config()
    config.data.vocab_size = VOCAB
    config.model.dtype = "float32"  # the float32 references below, whatever 'auto' picks here
    config.model.update(
        d_model=32,
        num_heads=4,
        num_kv_heads=kv_heads,
        num_layers=1,
        mlp_dim=64,
        max_len=16,
        dropout_rate=dropout,
        attention_dropout_rate=dropout,
    )
    config.mesh.data, config.mesh.model = mesh
    config.mesh.shard_embeddings = shard_embeddings
    config.parallelism = parallelism
    # Adam's eps 1e-9 turns the key bias's gradient (analytically 0: softmax ignores a shift shared by all keys;
    # numerically ~1e-9 noise whose sign depends on summation order) into a full-size step of either sign.
    config.optimizer.eps = 1e-6
    config_lib.validate(config)
    return config


def make_batches(steps=STEPS):
    """`steps` batches of 14 rows (not a multiple of 4 or 8: the trainers pad) with some padding."""
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(steps):
        src = rng.integers(3, VOCAB, (14, 8)).astype(np.int32)
        tgt = rng.integers(3, VOCAB, (14, 9)).astype(np.int32)
        lengths = rng.integers(3, 9, 14)
        keep = np.arange(8)[None] < lengths[:, None]
        src, tgt_in, tgt_out = src[:, :8] * keep, tgt[:, :-1] * keep, tgt[:, 1:] * keep
        batches.append(Batch(src, tgt_in, tgt_out, keep.astype(np.float32)))
    return batches


def as_dict(batch):
    return {"src": batch.src, "tgt_in": batch.tgt_in, "tgt_out": batch.tgt_out, "weights": batch.weights}


def optimizer(config):
    return optax.chain(optax.trace(decay=0.0), step_lib.make_optimizer(config.optimizer, config.num_train_steps))


def run(config, trainer=None, steps=STEPS):
    """(initial params, [loss per step], [grads per step], final params) on host, and the device state."""
    model = Transformer(config_lib.model_config(config, VOCAB))
    tx = optimizer(config)
    batches = make_batches(steps)
    if trainer is None:  # the reference: one device, plain jit
        state = jax.jit(lambda r: step_lib.create_state(model, tx, r, batches[0]))(jax.random.key(0))
        step = jax.jit(functools.partial(step_lib.train_step, label_smoothing=0.1))
        put = lambda b: b
    else:
        trainer = trainer(config, model, tx)
        state = trainer.init_state(jax.random.key(0), batches[0])
        step, put = trainer.step, trainer.put_batch
    init = np.concatenate([np.ravel(x) for x in jax.tree.leaves(jax.device_get(_unreplicate(trainer, state).params))])
    losses, grads = [], []
    for batch in batches:
        state, metrics = step(state, put(as_dict(batch)), jax.random.key(1))
        losses.append(float(metrics["loss"]))
        grads.append(_flat(_unreplicate(trainer, state).opt_state[0].trace))
    return {"init": init, "losses": losses, "grads": grads, "params": _flat(_unreplicate(trainer, state).params)}, state


def _unreplicate(trainer, state):
    return trainer.to_checkpoint(state) if trainer is not None else state


def _flat(tree):
    return np.concatenate([np.ravel(x) for x in jax.tree.leaves(jax.device_get(tree))])


def compare(result, reference):
    return {
        "init": float(np.max(np.abs(result["init"] - reference["init"]))),
        "loss": max(abs(a - b) for a, b in zip(result["losses"], reference["losses"])),
        "grads": max(float(np.max(np.abs(a - b))) for a, b in zip(result["grads"], reference["grads"])),
        "params": float(np.max(np.abs(result["params"] - reference["params"]))),
        "losses": result["losses"],
    }


def mesh_trainer(config, model, tx):
    return trainers.make_trainer(config, model, tx)


def leaf_info(state, name):
    """Spec and per-device shard shape of params leaf 'a/b/c' (and of its Adam first moment)."""

    def get(tree):
        for key in name.split("/"):
            tree = tree[key]
        return tree

    param = get(state.params)
    mu = get(state.opt_state[1][1][0].mu)  # chain(trace, chain(clip, adam)) -> adam's ScaleByAdamState
    return {
        "spec": [list(a) if isinstance(a, tuple) else a for a in param.sharding.spec],
        "shard_shape": list(param.addressable_shards[0].data.shape),
        "mu_shard_shape": list(mu.addressable_shards[0].data.shape),
    }


LEAVES = (
    "encoder/layer_0/self_attention/query/kernel",
    "encoder/layer_0/self_attention/key/kernel",
    "decoder/layer_0/cross_attention/value/bias",
    "decoder/layer_0/self_attention/out/kernel",
    "decoder/layer_0/mlp/wi/kernel",
    "decoder/layer_0/mlp/wi/bias",
    "decoder/layer_0/mlp/wo/kernel",
    "embed/embedding",
    "encoder/layer_0/ln_self/scale",
)


def main():
    jax.config.update("jax_num_cpu_devices", 8)
    jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp(prefix="headcount-sharding-cache-"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    out = {"devices": jax.device_count(), "equal": {}, "sharding": {}, "errors": {}}
    references = {}
    for name, kv, dropout in (("mha", 4, 0.0), ("gqa", 2, 0.1)):
        references[name], _ = run(make_config(kv, dropout))
        for mesh, shard_embeddings in (((4, 2), False), ((2, 4), True)):
            result, state = run(make_config(kv, dropout, mesh, shard_embeddings), mesh_trainer)
            key = f"{name}_{mesh[0]}x{mesh[1]}"
            out["equal"][key] = compare(result, references[name])
            if name == "gqa":
                out["sharding"][key] = {leaf: leaf_info(state, leaf) for leaf in LEAVES}
            if name == "mha" and mesh == (4, 2):
                saved = state

    pmap, _ = run(make_config(4, 0.0, parallelism="pmap"), lambda c, m, t: trainers.make_trainer(c, m, t))
    out["pmap"] = compare(pmap, references["mha"]) | {"jit_4x2_losses": out["equal"]["mha_4x2"]["losses"]}

    # A checkpoint written on mesh (4, 2) restored on mesh (2, 4) with shard_embeddings.
    config = make_config(4, 0.0, (2, 4), True)
    model = Transformer(config_lib.model_config(config, VOCAB))
    target_trainer = trainers.make_trainer(config, model, optimizer(config))
    target = target_trainer.init_state(jax.random.key(1), make_batches()[0])  # as the loop does: a fresh state
    with tempfile.TemporaryDirectory() as workdir:
        ckpts = checkpoints.Checkpoints(workdir, 1)
        ckpts.save(STEPS, saved)
        restored, step = ckpts.restore_latest(target)
        ckpts.close()
    out["restore"] = {
        "step": step,
        "max_diff": float(np.max(np.abs(_flat(restored) - _flat(saved)))),
        "query_spec": [
            a for a in restored.params["encoder"]["layer_0"]["self_attention"]["query"]["kernel"].sharding.spec
        ],
        "query_shard_shape": list(
            restored.params["encoder"]["layer_0"]["self_attention"]["query"]["kernel"].addressable_shards[0].data.shape
        ),
        "saved_query_shard_shape": list(
            saved.params["encoder"]["layer_0"]["self_attention"]["query"]["kernel"].addressable_shards[0].data.shape
        ),
    }

    # Bad meshes fail before anything compiles.
    for name, mesh in (("product", (3, 2)), ("rest", (-1, 3)), ("heads", (1, 8))):
        config = make_config(4, 0.0)
        config.mesh.data, config.mesh.model = mesh
        try:
            trainers.make_trainer(config, None, None)
        except ValueError as error:
            out["errors"][name] = str(error)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
