"""A config's programs built at its shapes and compiled for a target: train step, eval step, decode step, beam.

A `Mesh` over the target's devices, the train state and batch as `jax.ShapeDtypeStruct`s carrying the
run's own shardings (`trainers.MeshTrainer`), and `jit(...).lower(...).compile()` (`compiled._compile`).
Nothing is computed, and no corpus or tokenizer is loaded: the vocabulary is the config's
`data.vocab_size`, the batch the config's training shape (`train_shape`). Evaluation's programs are
compiled for one device as it runs them: the eval step, one step of incremental decoding with its KV cache
at the full decode length, and the whole beam search, at the config's longest decode (`decode_shape_of`).

The model is built for the target (`training.config.model_config(..., platform=)`): its backend
hooks and `model.dtype = "auto"` are chosen for the TPU, never for this host.
"""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np

from models import Transformer, decoding
from training import config as config_lib
from training.core import step as step_lib
from training.data.batching import PACKING_FIELDS, Batch, eval_lengths
from training.evaluation import dev as dev_lib
from training.evaluation import translate
from training.parallel import sharding, stacked, trainers
from training.run.aot.compiled import _compile, program_report
from training.run.aot.targets import Target, compile_only_devices

PROGRAMS = ("train", "eval", "decode", "beam")


def train_shape(config, data_shards: int = 1) -> tuple[int, int]:
    """(rows, length) of the config's largest training batch, rows padded to a multiple of `data_shards` as
    `sharding.put_batch` pads them: packed rows of `data.pack_length`, else the longest bucket."""
    length = config.data.pack_length or max(config.data.bucket_lengths)
    rows = max(1, config.data.token_budget // length)
    return -(-rows // data_shards) * data_shards, length


def eval_shape_of(config) -> tuple[int, int]:
    """(rows, length) of the config's longest dev batch (`batching.dev_batches`)."""
    length = max(config.eval.get("lengths", ()) or config.data.bucket_lengths)
    return max(1, config.data.token_budget // length), length


def compile_programs(
    config,
    target: Target,
    data: int = -1,
    model: int = 1,
    rows: int | None = None,
    programs: tuple[str, ...] = PROGRAMS,
    devices=None,
    keep_hlo: bool = False,
    stack: int = 0,
) -> dict:
    """Compile `programs` of `config` for `target` over a (data, model) mesh; {program: `program_report`}.

    stack: S > 0 compiles the train step of S seeds stacked into one program instead (`_stacked_train`).

    rows: the global training batch's rows (None: the config's, `train_shape`). The train step is the
    run's own (`MeshTrainer.step_fn`, state donated; on a GPU or TPU the step of the unlogged steps, without
    the gradient norm: `backends.grad_norm_every_step`); the eval step (`dev.eval_step_fn`), the decode step
    (`_decode_step_program`) and beam search (`_beam_program`) run as evaluation runs them, on one device
    with unsharded parameters, at the config's longest decode (`decode_shape_of`). keep_hlo: each report
    also holds the compiled module's text ("hlo").
    """
    unknown = [p for p in programs if p not in PROGRAMS]
    if unknown:
        raise ValueError(f"--programs = {','.join(programs)!r}; expected some of {PROGRAMS}")
    config = copy.deepcopy(config)
    config.parallelism = "jit"
    config.mesh.data, config.mesh.model = data, model
    config_lib.validate(config)
    devices = compile_only_devices(target) if devices is None else devices
    platform = target.chip.platform
    net = Transformer(config_lib.model_config(config, config.data.vocab_size, platform=platform))
    tx = step_lib.make_optimizer(config.optimizer, config.num_train_steps)
    trainer = trainers.make_trainer(config, net, tx, devices)
    data_shards = trainer.mesh.shape[sharding.DATA]
    default_rows, length = train_shape(config, data_shards)
    rows = default_rows if rows is None else -(-rows // data_shards) * data_shards
    packed = bool(config.data.pack_length)
    zeros = np.zeros((rows, length), np.int32)
    batch = Batch(zeros, zeros, zeros, zeros.astype(np.float32), *([zeros] * 4 if packed else []))
    state = trainer.abstract_state(jax.random.key(0), batch)
    reports = {}
    key_type = jax.random.key(0).dtype
    if "train" in programs:
        if stack:
            (compiled, lower_s, compile_s), mesh, batch_rows = _stacked_train(
                config, net, tx, target, devices, stack, rows, length, packed
            )
        else:
            spec = _batch_spec(rows, length, packed, sharding.batch_sharding(trainer.mesh))
            rng = jax.ShapeDtypeStruct((), key_type, sharding=sharding.replicated(trainer.mesh))
            compiled, lower_s, compile_s = _compile("train", target, trainer.step_fn, state, spec, rng)
            mesh, batch_rows = trainer.mesh, rows
        reports["train"] = program_report(
            compiled,
            lower_s,
            compile_s,
            target,
            devices=len(devices),
            mesh=dict(mesh.shape),
            batch=[batch_rows, length],
            **({"stack": stack} if stack else {}),
            keep_hlo=keep_hlo,
        )
    if set(programs) - {"train"}:  # evaluation's programs: one device, unsharded parameters
        one = jax.sharding.SingleDeviceSharding(devices[0])
        params = _placed(state.params, one)
    if "eval" in programs:
        eval_rows, eval_length = eval_shape_of(config)
        spec = _batch_spec(eval_rows, eval_length, False, one)
        compiled, lower_s, compile_s = _compile("eval", target, dev_lib.eval_step_fn(net), params, spec)
        reports["eval"] = program_report(
            compiled, lower_s, compile_s, target, devices=1, mesh={}, batch=[eval_rows, eval_length], keep_hlo=keep_hlo
        )
    for program, build in (("decode", _decode_step_program), ("beam", _beam_program)):
        if program in programs:
            fn, args, shape = build(config, net, params, one)
            compiled, lower_s, compile_s = _compile(program, target, fn, *args)
            reports[program] = program_report(
                compiled, lower_s, compile_s, target, devices=1, mesh={}, **shape, keep_hlo=keep_hlo
            )
    return reports


BEAM_SIZE = 4  # eval.py's --beam_size default: the config names no beam size (`eval.beam_size` overrides it)


def _stacked_train(config, net, tx, target: Target, devices, stack: int, rows: int, length: int, packed: bool):
    """The train step of `stack` seeds stacked (`training.parallel.stacked`) on a (seed, data) mesh over `devices`,
    each seed's batch `rows` x `length`, compiled for `target`: (`_compile`'s result, the mesh, a seed's rows)."""
    trainer = stacked.StackedTrainer(net, tx, config.optimizer.label_smoothing, stack, devices)
    zeros = np.zeros((rows, length), np.int32)
    state = trainer.abstract_state(Batch(zeros, zeros, zeros, zeros.astype(np.float32)))
    rows = sharding.padded_rows(rows, trainer.mesh)
    spec = {
        name: jax.ShapeDtypeStruct((stack, *struct.shape), struct.dtype, sharding=trainer.batch_sharding)
        for name, struct in _batch_spec(rows, length, packed, None).items()
    }
    per_seed = jax.ShapeDtypeStruct((stack,), jax.random.key(0).dtype, sharding=trainer.state_sharding)
    active = jax.ShapeDtypeStruct((stack,), jnp.bool_, sharding=trainer.state_sharding)
    return _compile("train", target, trainer.step_fn, state, spec, per_seed, active), trainer.mesh, rows


def decode_shape_of(config, net) -> tuple[int, int, int]:
    """(rows, source length, output length) of the config's longest decode batch, as `translate.translate`
    pads it: `dev.ROWS` sources of the longest dev length (`eval_shape_of`), output capped at that length +
    `eval.max_extra_length` and the model's max_len (with `eval.lengths`, the program's capacity)."""
    _, length = eval_shape_of(config)
    return dev_lib.ROWS, length, min(length + config.eval.max_extra_length, net.config.max_len)


def _placed(tree, where):
    """`tree`'s arrays as `ShapeDtypeStruct`s placed by `where`."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=where), tree)


def _decode_step_program(config, net, params, where):
    """One step of greedy decoding (`decoding._decode_step`, as `greedy_decode`'s loop runs it), its cache
    at the full decode length T: (params, cache [rows, T, ...] donated, encoded [rows, Ls, d_model],
    src [rows, Ls] int32, tokens [rows] int32) -> (log-probs [rows, vocab] float32, cache).

    The decoder grows its cache through `decoding.cache_lengths` (16, 32, ..., T), one program of loops;
    the step compiled here is its dearest, the last loop's at T positions. The cache is donated, as a
    `while_loop` updates its state in place. Returns (jitted step, its arguments, report fields).
    """
    rows, src_length, max_len = decode_shape_of(config, net)
    src = jax.ShapeDtypeStruct((rows, src_length), jnp.int32, sharding=where)
    encoded = jax.eval_shape(lambda p, s: net.apply({"params": p}, s, method="encode"), params, src)
    cache = jax.eval_shape(lambda p, e, s: decoding.init_cache(net, p, e, s, max_len), params, encoded, src)
    tokens = jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=where)
    step = jax.jit(lambda p, c, e, s, t: decoding._decode_step(net, p, c, e, s, t), donate_argnums=1)
    args = (params, _placed(cache, where), _placed(encoded, where), src, tokens)
    return step, args, {"batch": [rows, src_length], "max_len": max_len}


def _beam_program(config, net, params, where):
    """The whole of beam search as evaluation runs it (`translate.decoder`: `decoding.beam_search`, its cache
    grown through `cache_lengths`, early stop): (params, src [rows, Ls] int32[, limit [] int32 where
    `eval.lengths` is set]) -> tokens [rows, T] int32; `BEAM_SIZE` beams a source, so rows x K cache rows.
    Returns (jitted program, its arguments, report fields)."""
    rows, src_length, max_len = decode_shape_of(config, net)
    beam_size, limited = config.eval.get("beam_size", BEAM_SIZE), bool(eval_lengths(config))
    fn = translate.decoder(net, beam_size, config.eval.alpha, max_len, limited=limited)
    src = jax.ShapeDtypeStruct((rows, src_length), jnp.int32, sharding=where)
    limit = (jax.ShapeDtypeStruct((), jnp.int32, sharding=where),) if limited else ()
    return fn, (params, src, *limit), {"batch": [rows, src_length], "max_len": max_len, "beam_size": beam_size}


def _batch_spec(rows: int, length: int, packed: bool, where) -> dict:
    """The step's batch as `ShapeDtypeStruct`s [rows, length] placed by `where` (`batching.as_arrays`' fields)."""
    names = ("src", "tgt_in", "tgt_out", "weights", *(PACKING_FIELDS if packed else ()))
    return {
        name: jax.ShapeDtypeStruct((rows, length), jnp.float32 if name == "weights" else jnp.int32, sharding=where)
        for name in names
    }
