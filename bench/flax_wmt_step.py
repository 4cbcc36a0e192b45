"""Time Flax examples/wmt's own `train_step` on synthetic packed batches.

    python -m bench.flax_wmt_step --wmt_dir WMT --size small --steps 10   (WMT: a snapshot of Flax's examples/wmt)

Run from the repository root by bench/peer.py (`bench.lib.run_peer`) under the peer's interpreter.

Imports the example's `models.py` and `train.py` from --wmt_dir (nothing is copied), builds the
model config as its `train_and_evaluate` does (models.TransformerConfig, xavier_uniform kernels,
normal(1e-6) biases, eval-config init with jax.jit(m.init)), the optimizer as it does
(optax.adamw, b1 0.9, b2 0.98, eps 1e-9, weight_decay from configs/default.py, its rsqrt schedule
with linear warm-up), replicates the state and pmaps `train_step` over the local devices with
donate_argnums=(0,), exactly as the example's train loop, and feeds `common_utils.shard`ed numpy
batches. Prints one JSON line: median/min/max step seconds and slot tokens/s (rows*64/step).

Where `input_pipeline` (which pulls in tensorflow_text through tokenizer.py), tensorflow or clu
cannot be imported, an empty module stands in for it (`bench.lib.import_flax_example`); the step
never touches them. The JSON says which.

With --target_config (an XLA GPU target config, e.g. training/run/gpu_targets/h100_sxm.txtpb) nothing
runs: the same `train_step` is compiled for one such GPU on this CPU (the CUDA plugin's deviceless
route), over a one-device mesh named as the example's pmap axis ("batch"), the state donated, and its
optimised HLO is written to --hlo_out; the JSON line holds the compile's memory analysis.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

from bench.lib import PEER_LENGTH, PEER_SIZES, SIZES, VOCAB, import_flax_example


def packed_batch(rng, rows, length=PEER_LENGTH, vocab=VOCAB, per_row=3, fill=0.79):
    """One batch laid out as the example's pack_dataset lays it: `per_row` sentence pairs per
    row, positions restart at 0 in each segment, segment ids 1.., pad = 0 everywhere."""
    import numpy as np

    def side(total):
        # split `total` tokens into `per_row` sentences of >= 4 tokens, each ending with EOS (1)
        cuts = np.sort(rng.choice(np.arange(4, total - 3), per_row - 1, replace=False))
        lens = np.diff(np.concatenate([[0], cuts, [total]]))
        while lens.min() < 4:  # rare: re-draw
            cuts = np.sort(rng.choice(np.arange(4, total - 3), per_row - 1, replace=False))
            lens = np.diff(np.concatenate([[0], cuts, [total]]))
        tok = np.zeros(length, np.int32)
        seg = np.zeros(length, np.int32)
        pos = np.zeros(length, np.int32)
        at = 0
        for s, n in enumerate(lens, start=1):
            tok[at : at + n - 1] = rng.integers(2, vocab, n - 1)
            tok[at + n - 1] = 1
            seg[at : at + n] = s
            pos[at : at + n] = np.arange(n)
            at += n
        return tok, seg, pos

    out = {
        k: np.zeros((rows, length), np.int32)
        for k in (
            "inputs",
            "targets",
            "inputs_position",
            "targets_position",
            "inputs_segmentation",
            "targets_segmentation",
        )
    }
    for r in range(rows):
        for name in ("inputs", "targets"):
            total = int(np.clip(round(rng.normal(fill * length, 5)), 3 * 6, length))
            tok, seg, pos = side(total)
            out[name][r], out[name + "_segmentation"][r], out[name + "_position"][r] = tok, seg, pos
    return out


def _parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wmt_dir", required=True)
    p.add_argument("--size", choices=list(PEER_SIZES), required=True)
    p.add_argument("--batch", type=int, default=None, help="rows of 64 tokens (default: 20 small, 32 base)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--dtype", default="float32", help="compute dtype of TransformerConfig (example on CPU: float32)")
    p.add_argument("--attention_dropout", type=float, default=0.1)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--label", default="")
    p.add_argument(
        "--profile_dir", default="", help="after timing, trace 3 steps with the JAX profiler into this folder"
    )
    p.add_argument(
        "--target_config", default="", help="compile for this GPU target config instead of running (see above)"
    )
    p.add_argument("--hlo_out", default="", help="with --target_config: write the compiled HLO text here")
    return p.parse_args()


def _model_configs(args, models, default):
    """The example's config (configs/default.py with this run's vocabulary, rows, dropout and size) and the
    train and eval TransformerConfigs as its `train_and_evaluate` builds them: (cfg, rows, train, eval)."""
    import jax.numpy as jnp
    from flax import linen as nn

    cfg = default.get_config()
    size = PEER_SIZES[args.size]
    rows = args.batch or (SIZES[args.size][1] if args.size in SIZES else 4)
    cfg.vocab_size = VOCAB
    cfg.per_device_batch_size = rows
    cfg.dropout_rate = args.dropout
    cfg.attention_dropout_rate = args.attention_dropout
    for k, v in size.items():
        cfg[k] = v

    # --- as train_and_evaluate builds them ---
    train_config = models.TransformerConfig(
        vocab_size=VOCAB,
        output_vocab_size=VOCAB,
        share_embeddings=cfg.share_embeddings,
        logits_via_embedding=cfg.logits_via_embedding,
        dtype=jnp.dtype(args.dtype),
        emb_dim=cfg.emb_dim,
        num_heads=cfg.num_heads,
        num_layers=cfg.num_layers,
        qkv_dim=cfg.qkv_dim,
        mlp_dim=cfg.mlp_dim,
        max_len=max(cfg.max_target_length, cfg.max_eval_target_length),
        dropout_rate=cfg.dropout_rate,
        attention_dropout_rate=cfg.attention_dropout_rate,
        deterministic=False,
        decode=False,
        kernel_init=nn.initializers.xavier_uniform(),
        bias_init=nn.initializers.normal(stddev=1e-6),
    )
    eval_config = train_config.replace(deterministic=True)
    return cfg, rows, train_config, eval_config


def main():
    args = _parse_args()
    (train, models, default), stubbed = import_flax_example(args.wmt_dir, ("train", "models", "configs.default"))

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import jax_utils
    from flax.training import common_utils

    cfg, rows, train_config, eval_config = _model_configs(args, models, default)
    n_dev = jax.local_device_count()
    if args.target_config:
        return compile_for_gpu(args, train, models, train_config, eval_config, cfg, rows, stubbed)
    rng = jax.random.key(cfg.seed)
    rng, init_rng = jax.random.split(rng)
    shape = (rows, PEER_LENGTH)
    m = models.Transformer(eval_config)
    initial_variables = jax.jit(m.init)(init_rng, jnp.ones(shape, jnp.float32), jnp.ones(shape, jnp.float32))
    learning_rate_fn = train.create_learning_rate_schedule(
        learning_rate=cfg.learning_rate, warmup_steps=cfg.warmup_steps
    )
    state = train.TrainState.create(
        apply_fn=m.apply,
        params=initial_variables["params"],
        tx=optax.adamw(learning_rate=learning_rate_fn, b1=0.9, b2=0.98, eps=1e-9, weight_decay=cfg.weight_decay),
        dynamic_scale=None,
    )
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(state.params))
    del initial_variables
    state = jax_utils.replicate(state)
    p_train_step = jax.pmap(
        functools.partial(
            train.train_step,
            config=train_config,
            learning_rate_fn=learning_rate_fn,
            label_smoothing=cfg.label_smoothing,
        ),
        axis_name="batch",
        donate_argnums=(0,),
    )
    dropout_rngs = jax.random.split(rng, n_dev)

    drng = np.random.default_rng(0)
    batches = [packed_batch(drng, rows * n_dev) for _ in range(4)]
    nonpad = float(np.mean([(b["targets"] > 0).mean() for b in batches]))
    nonpad_in = float(np.mean([(b["inputs"] > 0).mean() for b in batches]))

    times = []
    for i in range(2 + args.steps):
        batch = common_utils.shard(jax.tree_util.tree_map(np.asarray, batches[i % len(batches)]))
        t0 = time.perf_counter()
        state, metrics = p_train_step(state, batch, dropout_rng=dropout_rngs)
        jax.block_until_ready((state, metrics))
        dt = time.perf_counter() - t0
        if i >= 2:
            times.append(dt)
    if args.profile_dir:
        with jax.profiler.trace(args.profile_dir, create_perfetto_trace=True):
            for i in range(3):
                state, metrics = p_train_step(
                    state, common_utils.shard(batches[i % len(batches)]), dropout_rng=dropout_rngs
                )
            jax.block_until_ready((state, metrics))
    loss = float(jax.device_get(metrics["loss"])[0] / jax.device_get(metrics["denominator"])[0])
    med = statistics.median(times)
    slots = rows * n_dev * PEER_LENGTH
    print(
        json.dumps(
            dict(
                side="flax_wmt",
                label=args.label,
                size=args.size,
                dtype=args.dtype,
                rows=rows * n_dev,
                length=PEER_LENGTH,
                devices=n_dev,
                params=n_params,
                attention_dropout=args.attention_dropout,
                dropout=args.dropout,
                steps=args.steps,
                median_s=round(med, 4),
                min_s=round(min(times), 4),
                max_s=round(max(times), 4),
                slot_tok_s=round(slots / med, 1),
                target_nonpad=round(nonpad, 3),
                input_nonpad=round(nonpad_in, 3),
                last_loss=round(loss, 3),
                times=[round(t, 4) for t in times],
                stubbed=stubbed,
                jax=jax.__version__,
                backend=jax.default_backend(),
            )
        ),
        flush=True,
    )


def compile_for_gpu(args, train, models, train_config, eval_config, cfg, rows, stubbed):
    """Compile the example's `train_step` (its optimizer and schedule as `main` builds them) for one GPU of
    `args.target_config`; write its HLO to `args.hlo_out` and print one JSON line (memory, seconds)."""
    from pathlib import Path

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = topologies.get_topology_desc(
        platform="cuda", target_config=Path(args.target_config).read_text(), topology="1x1x1"
    ).devices
    mesh = Mesh(np.array(devices), ("batch",))
    learning_rate_fn = train.create_learning_rate_schedule(
        learning_rate=cfg.learning_rate, warmup_steps=cfg.warmup_steps
    )
    shape = (rows, PEER_LENGTH)
    m = models.Transformer(eval_config)

    def create():
        params = m.init(jax.random.key(0), jnp.ones(shape, jnp.float32), jnp.ones(shape, jnp.float32))["params"]
        tx = optax.adamw(learning_rate=learning_rate_fn, b1=0.9, b2=0.98, eps=1e-9, weight_decay=cfg.weight_decay)
        return train.TrainState.create(apply_fn=m.apply, params=params, tx=tx, dynamic_scale=None)

    replicated = NamedSharding(mesh, P())
    place = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated)
    state = jax.tree.map(place, jax.eval_shape(create))
    names = ("inputs", "targets", "inputs_position", "targets_position", "inputs_segmentation", "targets_segmentation")
    batch = {k: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=NamedSharding(mesh, P("batch"))) for k in names}
    rng = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=replicated)
    step = functools.partial(
        train.train_step, config=train_config, learning_rate_fn=learning_rate_fn, label_smoothing=cfg.label_smoothing
    )
    sharded = jax.shard_map(
        lambda s, b, r: step(s, b, dropout_rng=r),
        mesh=mesh,
        in_specs=(P(), P("batch"), P()),
        out_specs=(P(), P()),
        check_vma=False,
    )
    start = time.perf_counter()
    lowered = jax.jit(sharded, donate_argnums=(0,)).lower(state, batch, rng)
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - lowered_at
    Path(args.hlo_out).write_text(compiled.as_text())
    memory = compiled.memory_analysis()
    fields = ("argument", "output", "alias", "temp", "generated_code")
    print(
        json.dumps(
            dict(
                side="flax_wmt",
                label=args.label,
                size=args.size,
                dtype=args.dtype,
                rows=rows,
                length=PEER_LENGTH,
                target_config=args.target_config,
                hlo=args.hlo_out,
                lower_s=round(lowered_at - start, 2),
                compile_s=round(compile_s, 2),
                memory_bytes={f: int(getattr(memory, f"{f}_size_in_bytes")) for f in fields},
                stubbed=stubbed,
                jax=jax.__version__,
            )
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
