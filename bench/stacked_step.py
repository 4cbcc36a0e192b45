"""One core: a point's seeds stepped as one stacked program against the same seeds stepped one after the other.

    taskset -c 1 python -m bench.stacked_step --vocab runs/stacked_check/alone/stacked_check/spm.model \
        [--config configs/stacked_check.py] [--seeds 3] [--steps 10] [--rounds 4]

Both sides run the training's own steps on the config's prepared training split and each seed's own batches:
"alone" is the single-run trainer (`trainers.make_trainer`) stepping each seed's state in turn, "stacked" the
stacked trainer (`training.parallel.stacked`) stepping all of them at once, on one device. Rounds alternate
the sides (the first round of each, which compiles, is left out); printed: each side's median seconds for one
step of every seed, and stacked / alone. Pin it to one core, away from any run, and name the CPU beside it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp

from bench.lib import cpu_description
from sweeps import schema
from training import config as config_lib, prepared
from training.core import step as step_lib
from training.data import tokenizer
from training.data.batching import as_arrays
from training.parallel import stacked, trainers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/stacked_check.py", help="a sweep config; its reference point")
    parser.add_argument("--vocab", type=Path, required=True, help="the sweep's vocabulary (its spm.model)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="steps a round")
    parser.add_argument("--rounds", type=int, default=4, help="timed rounds a side (after one untimed)")
    args = parser.parse_args()
    config = schema.load_module(args.config).get_config(None)
    vocab_proto = args.vocab.read_bytes()
    data = prepared.prepare(config, vocab_proto=vocab_proto)
    model = config_lib.build_model(config, tokenizer.load(vocab_proto), config.model.dtype)
    seeds = list(range(args.seeds))
    configs = []
    for seed in seeds:
        c = config.copy_and_resolve_references()
        c.seed = seed
        configs.append(c)
    schedules = [prepared.schedule(c, data) for c in configs]
    tx = step_lib.make_optimizer(config.optimizer, config.num_train_steps)
    keys = [jax.random.split(jax.random.key(seed)) for seed in seeds]
    device = jax.devices()[:1]

    one = config.copy_and_resolve_references()
    one.mesh.data = one.mesh.model = 1
    alone = trainers.make_trainer(one, model, tx, device)
    states = [alone.init_state(k[0], schedules[0].batch(0)) for k in keys]
    together = stacked.StackedTrainer(model, tx, config.optimizer.label_smoothing, len(seeds), device)
    stacked_state = together.init_state(jnp.stack([k[0] for k in keys]), schedules[0].batch(0))
    stacked_rngs = jnp.stack([k[1] for k in keys])

    def alone_round(start: int) -> float:
        nonlocal states
        began = time.perf_counter()
        for step in range(start, start + args.steps):
            for i, schedule in enumerate(schedules):
                batch = alone.put_batch(as_arrays(schedule.batch(step)))
                states[i], metrics = alone.step(states[i], batch, keys[i][1], logged=False)
                jax.block_until_ready(metrics)
        return (time.perf_counter() - began) / args.steps

    def stacked_round(start: int) -> float:
        nonlocal stacked_state
        began = time.perf_counter()
        for step in range(start, start + args.steps):
            batch = together.put_batch([as_arrays(s.batch(step)) for s in schedules])
            stacked_state, metrics = together.step(stacked_state, batch, stacked_rngs, logged=False)
            jax.block_until_ready(metrics)
        return (time.perf_counter() - began) / args.steps

    times: dict[str, list[float]] = {"alone": [], "stacked": []}
    for r in range(args.rounds + 1):
        for name, run in (("alone", alone_round), ("stacked", stacked_round)):
            seconds = run(r * args.steps)
            if r:
                times[name].append(seconds)
    a, s = statistics.median(times["alone"]), statistics.median(times["stacked"])
    print(f"{args.config}: {len(seeds)} seeds, {args.rounds} rounds x {args.steps} steps a side, alternating")
    print(f"CPU: {cpu_description()}")
    print(f"alone (one seed after another): {a:.3f} s for a step of every seed (rounds: {times['alone']})")
    print(f"stacked (one program): {s:.3f} s for a step of every seed (rounds: {times['stacked']})")
    print(f"stacked / alone: {s / a:.3f}")


if __name__ == "__main__":
    main()
