"""The loss's two readings of the targets' logits on this CPU: the plain masked sum against XLA:CPU's gather.

    taskset -c 0 python -m bench.loss_pick --rounds 6      # results/code_choices.md, "Loss: the targets' logits"

Two workloads, each jitted once with `training.core.step.target_logits` (a masked sum over the
vocabulary, what GPUs and TPUs run) and once with `backends.xla_cpu.target_logits` (a gather, whose
gradient scatters): the loss alone (`token_losses`, label smoothing 0.1, its gradient with respect
to float32 logits [rows, 64, vocab]) and the whole train step (`step.train_step`, the default config
at the small size, float32 and bfloat16, on one synthetic [rows, 64] batch), rows and vocabulary
those of bench.lib's small size (20, 8000). Rounds alternate which goes first; each round is the
median of `--reps` calls on this process's CPU time. Prints each one's median over rounds and the
ratio masked sum / gather (above 1: the gather pays on this CPU; results/code_choices.md's bar: 3 %
of the train step).
"""

from __future__ import annotations

import argparse
import functools
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from backends import xla_cpu
from bench.lib import PEER_LENGTH, SIZES, VOCAB, cpu_description, median_ms, our_config, synthetic_batch
from training import config as config_lib
from training.core import step
from training.core.markdown import markdown_row, markdown_table
from training.data.batching import as_arrays
from training.parallel import trainers

PICKS = {"masked sum": step.target_logits, "gather": xla_cpu.target_logits}


def alternating(calls: dict, rounds: int, reps: int) -> dict:
    """{name: median ms over `rounds` rounds, each the median of `reps` calls}, the order reversed in odd rounds."""
    seconds = {name: [] for name in calls}
    for round_ in range(rounds):
        for name in list(calls)[:: 1 if round_ % 2 == 0 else -1]:
            seconds[name].append(median_ms(calls[name], reps))
    return {name: statistics.median(v) for name, v in seconds.items()}


def train_steps(dtype: str, rows: int) -> dict:
    """{pick: a call of the small default config's train step with it}, on one synthetic batch."""

    class Vocab:
        def vocab_size(self):
            return VOCAB

    config = our_config("small", dtype, {})
    model = config_lib.build_model(config, Vocab(), dtype)
    trainer = trainers.make_trainer(config, model, step.make_optimizer(config.optimizer, config.num_train_steps))
    batch = synthetic_batch(rows, PEER_LENGTH, VOCAB)
    state, arrays = trainer.init_state(jax.random.key(0), batch), trainer.put_batch(as_arrays(batch))
    calls = {}
    for name, pick in PICKS.items():
        fn = jax.jit(functools.partial(step.train_step, label_smoothing=config.optimizer.label_smoothing, pick=pick))
        calls[name] = lambda fn=fn: jax.block_until_ready(fn(state, arrays, jax.random.key(1))[1])
        calls[name]()  # compile
    return calls


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=SIZES["small"][1])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(args.rows, PEER_LENGTH, VOCAB)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, VOCAB, (args.rows, PEER_LENGTH)), jnp.int32)
    weights = jnp.ones((args.rows, PEER_LENGTH), jnp.float32)
    grads = {
        name: jax.jit(jax.grad(lambda z, pick=pick: step.token_losses(z, targets, weights, 0.1, pick)[0]))
        for name, pick in PICKS.items()
    }
    got = {name: np.asarray(g(logits)) for name, g in grads.items()}
    print(cpu_description())
    print(
        f"median of {args.rounds} alternating rounds (each the median of {args.reps} calls, CPU time); "
        "largest difference "
        f"between the two loss gradients {np.abs(got['masked sum'] - got['gather']).max():.1e}"
    )
    print(markdown_table(["workload", "masked sum ms", "gather ms", "masked sum / gather"], [], "lrrr"))
    workloads = {
        f"loss gradient [{args.rows}, {PEER_LENGTH}, {VOCAB}]": {
            name: (lambda g=g: g(logits).block_until_ready()) for name, g in grads.items()
        }
    }
    workloads.update(
        {f"train step, small, {dtype}": train_steps(dtype, args.rows) for dtype in ("float32", "bfloat16")}
    )
    for label, calls in workloads.items():
        ms = alternating(calls, args.rounds, args.reps)
        ratio = ms["masked sum"] / ms["gather"]
        print(markdown_row([label, f"{ms['masked sum']:.1f}", f"{ms['gather']:.1f}", f"{ratio:.3f}"]))


if __name__ == "__main__":
    main()
