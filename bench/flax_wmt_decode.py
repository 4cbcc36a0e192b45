"""Time Flax examples/wmt's own beam search (`predict_step`) on synthetic source batches.

    python -m bench.flax_wmt_decode --wmt_dir WMT --batch 20 --max_len 64 --batches 3
    (WMT: a snapshot of Flax's examples/wmt)

Run from the repository root by bench/peer_decode.py under the peer's interpreter; where the
example's tensorflow, clu or input_pipeline imports fail, empty modules stand in for them
(`bench.lib.import_flax_example`): beam search never touches them. The JSON says which.

Imports the example's `train.py`, `models.py`, `decode.py` from --wmt_dir (nothing is copied) and
builds the small model as `train_and_evaluate` does (emb/qkv 256, mlp 1024, 4 heads, 3 layers,
vocab 8000, shared embeddings, logits via embedding, max_len 256; xavier_uniform kernels,
normal(1e-6) biases, random init, dtype `train.preferred_dtype` = float32 on CPU). Then, as its loop
does, pmaps `initialize_cache` and `predict_step` (beam_size 4, alpha 0.6 inside it,
static_broadcasted_argnums=(3, 4)) and per batch calls p_init_cache, p_pred_step, tohost.

Decode cost does not depend on the weights once the length is fixed, so by default eos_id=-1 is
passed: no beam can ever finish, and the loop runs max_len-1 steps (the example's loop stops at
cur_index == max_decode_len-1 and returns max_decode_len-1 tokens). --eos uses decode.EOS_ID instead.
Sources: random ids ending in EOS, lengths ~ Multi30k German (SentencePiece 8k: mean 15 + EOS,
sd 5.7), padded with 0 to --input_len. Prints one JSON line; the first batch (compile) is not timed.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

from bench.lib import PEER_SIZES, VOCAB, import_flax_example


def source_batch(rng, rows, length, eos_id, mean=16.0, sd=5.7):
    """[rows, length] int32: random ids in [3, VOCAB), each row ending in EOS, zero padded."""
    import numpy as np

    out = np.zeros((rows, length), np.int32)
    lens = np.clip(np.rint(rng.normal(mean, sd, rows)), 5, length).astype(int)
    for r, n in enumerate(lens):
        out[r, : n - 1] = rng.integers(3, VOCAB, n - 1)
        out[r, n - 1] = eos_id
    return out, lens


def _parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wmt_dir", required=True)
    p.add_argument("--batch", type=int, default=20, help="source rows per batch (per device)")
    p.add_argument("--max_len", type=int, default=64, help="the example's max_predict_length (decode steps = this - 1)")
    p.add_argument("--input_len", type=int, default=64, help="source rows are padded to this")
    p.add_argument("--batches", type=int, default=3, help="timed batches after one warm-up")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--eos", action="store_true", help="let EOS end beams (random weights: length then varies)")
    p.add_argument("--dtype", default=None, help="override train.preferred_dtype (float32 on CPU)")
    p.add_argument("--label", default="")
    p.add_argument("--toy", action="store_true", help="a toy model instead of the small one (a dry run)")
    return p.parse_args()


def main():
    args = _parse_args()
    (train, models, decode, default), stubbed = import_flax_example(
        args.wmt_dir, ("train", "models", "decode", "configs.default")
    )

    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import jax_utils
    from flax import linen as nn
    from flax.training import common_utils

    cfg = default.get_config()
    cfg.vocab_size = VOCAB
    cfg.per_device_batch_size = args.batch
    cfg.beam_size = args.beam
    cfg.max_predict_length = args.max_len
    for k, v in PEER_SIZES["toy" if args.toy else "small"].items():
        cfg[k] = v
    dtype = jnp.dtype(args.dtype) if args.dtype else train.preferred_dtype(cfg)
    n_dev = jax.local_device_count()

    # --- as train_and_evaluate builds them ---
    train_config = models.TransformerConfig(
        vocab_size=VOCAB,
        output_vocab_size=VOCAB,
        share_embeddings=cfg.share_embeddings,
        logits_via_embedding=cfg.logits_via_embedding,
        dtype=dtype,
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
    predict_config = train_config.replace(deterministic=True, decode=True)
    shape = (args.batch, cfg.max_target_length)
    init_rng = jax.random.split(jax.random.key(cfg.seed))[1]
    m = models.Transformer(eval_config)
    params = jax.jit(m.init)(init_rng, jnp.ones(shape, jnp.float32), jnp.ones(shape, jnp.float32))["params"]
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
    params = jax_utils.replicate(params)

    p_init_cache = jax.pmap(
        functools.partial(train.initialize_cache, max_decode_len=cfg.max_predict_length, config=predict_config),
        axis_name="batch",
    )
    p_pred_step = jax.pmap(
        functools.partial(train.predict_step, config=predict_config, beam_size=cfg.beam_size),
        axis_name="batch",
        static_broadcasted_argnums=(3, 4),
    )
    eos_id = decode.EOS_ID if args.eos else -1

    drng = np.random.default_rng(0)
    batches = [source_batch(drng, args.batch * n_dev, args.input_len, decode.EOS_ID) for _ in range(1 + args.batches)]
    times, out_lens = [], []
    for i, (src, _) in enumerate(batches):
        t0 = time.perf_counter()
        inputs = common_utils.shard(src)
        cache = p_init_cache(inputs)
        predicted = train.tohost(p_pred_step(inputs, params, cache, eos_id, cfg.max_predict_length))
        dt = time.perf_counter() - t0
        if i == 0:
            compile_s = dt
        else:
            times.append(dt)
        out_lens += [int(np.argmax(r == decode.EOS_ID)) + 1 if decode.EOS_ID in r else len(r) for r in predicted]
    med = statistics.median(times)
    rows = args.batch * n_dev
    print(
        json.dumps(
            dict(
                side="flax_wmt_decode",
                label=args.label,
                batch=rows,
                beam=args.beam,
                alpha=0.6,
                max_len=args.max_len,
                decode_steps=args.max_len - 1,
                input_len=args.input_len,
                mean_src_len=round(float(np.mean(np.concatenate([b[1] for b in batches]))), 2),
                eos_stops=args.eos,
                mean_out_len=round(float(np.mean(out_lens)), 2),
                dtype=str(jnp.dtype(dtype)),
                params=n_params,
                batches=args.batches,
                sent_per_s=round(rows / med, 2),
                median_s=round(med, 4),
                min_s=round(min(times), 4),
                max_s=round(max(times), 4),
                compile_s=round(compile_s, 2),
                times=[round(t, 4) for t in times],
                devices=n_dev,
                stubbed=stubbed,
                jax=jax.__version__,
                backend=jax.default_backend(),
            )
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
