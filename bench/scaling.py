"""Communication in the compiled, sharded train step per device mesh (and, on a GPU, one-GPU step time).

    python -m bench.scaling                  # CPU: 8 fake devices, meshes of 1, 2, 4, 8 (results/scaling.md)
    python -m bench.scaling --gpu            # one GPU: base size, bfloat16, cudnn vs XLA attention

Fake CPU devices share the machine's cores, so their step times say nothing about scaling.
What the mesh changes, and what this script reports, is the collectives XLA put into the step
(count and bytes of all-reduce / all-gather / reduce-scatter / all-to-all / collective-permute,
read from the compiled HLO; bytes are each op's result, per device) and the train state a
device holds. The ratio column compares total collective bytes with pure data parallelism
(model=1) on the same number of devices, compiled in the same run.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

if "--gpu" not in sys.argv:  # before JAX starts: the device count is fixed then
    # LLVM -O0: the collectives are placed by XLA's HLO passes, before the LLVM back end; it only compiles faster
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
    )

import jax
import numpy as np

from bench.lib import SIZES, median_ms, synthetic_batch
from configs import default
from models import Transformer
from training import config as config_lib
from training.parallel import trainers
from training.run.hlo import collectives
from training.core import step as step_lib
from training.core.markdown import markdown_row, markdown_table

MESH_TITLES = ["devices", "mesh (data x model)", "rows / device", "state MB / device", "all-reduce", "all-gather"]
MESH_TITLES += ["reduce-scatter", "other", "total MB", "vs model=1"]


def make_config(size, data, model, kv_heads, shard_embeddings, parallelism="jit"):
    config = default.get_config()
    config.model.update(num_kv_heads=kv_heads, **SIZES[size][0])
    config.mesh.data, config.mesh.model, config.mesh.shard_embeddings = data, model, shard_embeddings
    config.parallelism = parallelism
    config_lib.validate(config)
    return config


def state_bytes_per_device(state) -> int:
    """Bytes of the train state one device holds (for pmap: all of it)."""

    def nbytes(leaf):
        shape = leaf.sharding.shard_shape(leaf.shape) if getattr(leaf, "sharding", None) is not None else leaf.shape
        return int(np.prod(shape)) * leaf.dtype.itemsize

    return sum(nbytes(leaf) for leaf in jax.tree.leaves(state))


def measure(config, devices, rows, length):
    """({collective: (count, bytes)}, state bytes per device) of the compiled step; the state is never computed."""
    model = Transformer(config_lib.model_config(config, config.data.vocab_size))
    trainer = trainers.make_trainer(
        config, model, step_lib.make_optimizer(config.optimizer, config.num_train_steps), devices
    )
    batch = synthetic_batch(rows, length, config.data.vocab_size)
    arrays = trainer.put_batch(
        {"src": batch.src, "tgt_in": batch.tgt_in, "tgt_out": batch.tgt_out, "weights": batch.weights}
    )
    if config.parallelism == "jit":
        state = trainer.abstract_state(jax.random.key(0), batch)
        per_device = state_bytes_per_device(state)
    else:
        state = trainer.init_state(jax.random.key(0), batch)
        per_device = state_bytes_per_device(jax.eval_shape(lambda: trainer.to_checkpoint(state)))
    hlo = trainer.step_fn.lower(state, arrays, jax.random.key(1)).compile().as_text()
    return collectives(hlo), per_device


def meshes(max_devices, num_heads):
    for n in (1, 2, 4, 8):
        if n <= max_devices:
            for model in (1, 2, 4, 8):
                if model <= n and model <= num_heads:
                    yield n, n // model, model


def cpu_tables(args):
    devices = jax.devices()
    rows = [
        f"jax {jax.__version__}, {len(devices)} fake CPU devices; size {args.size} ({SIZES[args.size][0]}), "
        f"vocab {default.get_config().data.vocab_size}, global batch {args.rows} x {args.length}, float32",
        "",
    ]
    for kv_heads, shard_embeddings in args.variants:
        heads = SIZES[args.size][0]["num_heads"]
        rows += [
            f"### {heads} query heads, {kv_heads or heads} K/V heads, "
            f"embeddings {'split over model' if shard_embeddings else 'replicated'}",
            "",
            markdown_table(MESH_TITLES, [], "rlrrllllrr"),
        ]
        reference = {}
        for n, data, model in meshes(len(devices), heads):
            if (kv_heads, shard_embeddings) != args.variants[0] and n != len(devices):
                continue  # the variants on the full device count only
            config = make_config(args.size, data, model, kv_heads, shard_embeddings)
            found, state_bytes = measure(config, devices[:n], args.rows, args.length)
            total = sum(b for _, b in found.values())
            reference.setdefault(n, total)
            other = [found[op] for op in ("all-to-all", "collective-permute")]
            cell = lambda c, b: f"{c} / {b / 2**20:.2f} MB" if c else "0"
            ratio = f"{total / reference[n]:.2f}x" if reference[n] else "-"
            ops = [cell(*found[op]) for op in ("all-reduce", "all-gather", "reduce-scatter")]
            ops.append(cell(sum(c for c, _ in other), sum(b for _, b in other)))
            row = [n, f"{data} x {model}", -(-args.rows // data), f"{state_bytes / 2**20:.1f}", *ops]
            rows.append(markdown_row([*row, f"{total / 2**20:.2f}", ratio]))
            print(rows[-1], file=sys.stderr, flush=True)
        rows.append("")
    if args.pmap:
        config = make_config(args.size, 1, 1, None, False, parallelism="pmap")
        found, state_bytes = measure(config, devices, args.rows, args.length)
        total = sum(b for _, b in found.values())
        rows += [
            f"pmap over {len(devices)} devices (parallelism='pmap', MHA): all-reduce {found['all-reduce'][0]} ops / "
            f"{found['all-reduce'][1] / 2**20:.2f} MB, all collectives {total / 2**20:.2f} MB, "
            f"state {state_bytes / 2**20:.1f} MB / device",
            "",
        ]
    return "\n".join(rows)


def gpu_table(args):
    """Single-GPU step time at Transformer-base size, bfloat16: cudnn attention against XLA's, same run."""

    def seconds(impl):
        config = make_config("base", 1, 1, None, False)
        config.model.update(dtype="bfloat16", attention_impl=impl, dropout_rate=0.1)
        model = Transformer(config_lib.model_config(config, config.data.vocab_size))
        tx = step_lib.make_optimizer(config.optimizer, config.num_train_steps)
        batch = synthetic_batch(args.gpu_rows, args.length, config.data.vocab_size)
        arrays = {"src": batch.src, "tgt_in": batch.tgt_in, "tgt_out": batch.tgt_out, "weights": batch.weights}
        state = jax.jit(lambda r: step_lib.create_state(model, tx, r, batch))(jax.random.key(0))
        step = jax.jit(functools.partial(step_lib.train_step, label_smoothing=0.1))

        def run():  # each step trains on from the last step's state
            nonlocal state
            state, metrics = step(state, arrays, jax.random.key(1))
            jax.block_until_ready(metrics["loss"])

        return median_ms(run, args.reps, clock="wall", warmup=2) / 1e3  # the first two calls compile

    device = jax.devices()[0]
    results = {impl: seconds(impl) for impl in ("xla", "cudnn")}
    tokens = args.gpu_rows * args.length
    lines = [
        f"jax {jax.__version__}, {device.device_kind}; base size, bfloat16 compute, "
        f"batch {args.gpu_rows} x {args.length}",
        "",
        markdown_table(["attention", "step ms", "target tokens/s", "vs xla"], [], "lrrr"),
    ]
    for impl, s in results.items():
        lines.append(markdown_row([impl, f"{s * 1e3:.1f}", f"{tokens / s:,.0f}", f"{results['xla'] / s:.2f}x"]))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--rows", type=int, default=32, help="global batch rows")
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--no-pmap", dest="pmap", action="store_false")
    parser.add_argument("--gpu", action="store_true", help="time one GPU instead (needs a GPU)")
    parser.add_argument(
        "--gpu-rows", type=int, default=384, help="~25k target tokens at length 64, as Vaswani's batches"
    )
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    # (kv heads, shard_embeddings): MHA; MHA with split embeddings; MQA (one K/V head, never split)
    args.variants = [(None, False), (None, True), (1, False)]
    print(gpu_table(args) if args.gpu else cpu_tables(args))


if __name__ == "__main__":
    main()
