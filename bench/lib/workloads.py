"""The workloads the comparisons time: synthetic and real batches, our config at a size, our training step over
an epoch's shapes (`Ours`), our beam search (`OursDecode`), and the peer's step run under its interpreter.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from collections.abc import Callable

import numpy as np

from bench.lib.child import run_json_script
from bench.lib.flax_example import flax_wmt_dir
from bench.lib.flops import compiled_flops, dot_seconds
from bench.lib.sizes import PEER_LENGTH, SIZES, TOY
from bench.lib.timing import median_ms


def synthetic_batch(rows: int, length: int, vocab: int, seed: int = 0):
    """A `training.data.batching.Batch` of random tokens in [4, vocab), every position real (weights 1)."""
    from training.data.batching import Batch

    rng = np.random.default_rng(seed)
    tokens = lambda: rng.integers(4, vocab, (rows, length), dtype=np.int32)
    return Batch(tokens(), tokens(), tokens(), np.ones((rows, length), np.float32))


def corpus_vocab(config, pairs: int | None = None, vocab_size: int | None = None):
    """(Multi30k's training corpus as `config` reads it, the SentencePiece vocabulary trained on its
    first `pairs` pairs (None: all) at `vocab_size` (None: the config's)), as the training loop trains it."""
    from training.data import tokenizer
    from training.data.corpus import load_corpus

    train = load_corpus(config, config.data.train_split)
    src, tgt = train.src[:pairs], train.tgt[:pairs]
    vocab = tokenizer.load(tokenizer.train(src + tgt, vocab_size or config.data.vocab_size, config.seed))
    return train, vocab


def our_config(size: str, dtype: str, overrides: dict):
    """The default config at `size`, `dtype`, with the peer's slots per step, then `overrides` {"a.b": value}."""
    from configs import default
    from training import config as config_lib

    config = default.get_config()
    config.model.update(SIZES[size][0])
    config.model.dtype = dtype
    config.data.token_budget = SIZES[size][1] * PEER_LENGTH
    config.compilation_cache_dir = ""
    for path, value in overrides.items():
        *sections, field = path.split(".")
        node = config
        for section in sections:
            node = node[section]
        node[field] = value
    config_lib.validate(config)
    return config


def parse_variant(text: str) -> tuple[str, dict]:
    """'packed:data.pack_length=64,data.token_budget=1280' -> (label, {path: Python literal (or the bare string)})."""
    label, _, pairs = text.partition(":")
    overrides = {}
    for pair in filter(None, pairs.split(",")):
        path, _, value = pair.partition("=")
        try:
            overrides[path] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            overrides[path] = value
    return label, overrides


def with_fields(model, overrides: dict | None):
    """`model` (a `models.Transformer`) with these `TransformerConfig` fields replaced, e.g. a backend hook
    (`dot_general`, `formulation`, `dropout_keep`) taken out to time the model without it."""
    import dataclasses

    return type(model)(dataclasses.replace(model.config, **overrides)) if overrides else model


@functools.cache
def no_logits_barrier():
    """XLA:CPU's formulation (`backends.xla_cpu.FORMULATION`) with a decode step's log-probabilities spelled
    plainly: no barrier between the vocabulary matmul and log_softmax, every other barrier kept. One instance
    (of one class) a process, so configs holding it compare equal."""
    from attention.head import Formulation
    from backends import xla_cpu

    class NoLogitsBarrier(xla_cpu.XlaCpuFormulation):
        def decode_log_probs(self, logits):
            return Formulation.decode_log_probs(self, logits)

    return NoLogitsBarrier()


class Ours:
    """Our side of the training-step comparison: the training loop's trainer for one config, compiled
    for every bucket shape of an epoch of real batches; `epoch_rates` times the epoch's shapes."""

    def __init__(self, config, vocab, src_ids, tgt_ids, reps: int, model_overrides: dict | None = None):
        import jax

        from training import config as config_lib
        from training.data.batching import BatchSchedule, as_arrays
        from training.parallel import trainers
        from training.core import step as step_lib

        self.model = with_fields(config_lib.build_model(config, vocab, config.model.dtype), model_overrides)
        self.schedule = BatchSchedule(
            src_ids,
            tgt_ids,
            token_budget=config.data.token_budget,
            bucket_lengths=config.data.bucket_lengths,
            seed=config.seed,
            pack_length=config.data.pack_length,
        )
        tx = step_lib.make_optimizer(config.optimizer, config.num_train_steps)
        self.trainer = trainers.make_trainer(config, self.model, tx)
        self.rng = jax.random.key(1)
        self.state = self.trainer.init_state(jax.random.key(0), self.schedule.batch(0))
        self.counts, self.useful, self.slots = defaultdict(int), defaultdict(float), defaultdict(int)
        batches = defaultdict(list)  # shape -> the first `reps` real batches of that shape in epoch 0
        for step in range(self.schedule.batches_per_epoch):
            batch = self.schedule.batch(step)
            shape = batch.tgt_out.shape
            self.counts[shape] += 1
            self.useful[shape] += float(batch.weights.sum())
            self.slots[shape] += batch.tgt_out.size
            if len(batches[shape]) < reps:
                batches[shape].append(as_arrays(batch))
        self.batches = dict(batches)
        self.flops = {shape: self.flops_of(b[0]) for shape, b in self.batches.items()}
        self.compiled = False

    def flops_of(self, batch: dict) -> float:
        """XLA's FLOP count of one step on `batch` (a dict of arrays)."""
        return compiled_flops(self.trainer.step_fn.lower(self.state, self.trainer.put_batch(batch), self.rng))

    def run_step(self, shape, i=0):
        """One step on the `i`-th kept batch of `shape`, waited for."""
        import jax

        batch = self.batches[shape][i % len(self.batches[shape])]
        self.state, metrics = self.trainer.step(self.state, self.trainer.put_batch(batch), self.rng)
        jax.device_get(metrics)  # as the loop: waits for the step

    def epoch_rates(self, clock: str) -> dict:
        """Useful and slot target tokens/s over an epoch, its mean step seconds, and FLOPs per second."""
        if not self.compiled:  # compile every shape outside the clock
            for shape in self.batches:
                self.run_step(shape)
            self.compiled = True
        seconds = {}
        for shape in self.batches:
            calls = iter(range(10**9))
            reps = len(self.batches[shape])
            seconds[shape] = (
                median_ms(lambda: self.run_step(shape, next(calls)), max(reps, 2), clock=clock, warmup=0) / 1e3
            )
        total = sum(self.counts[s] * seconds[s] for s in seconds)
        return dict(
            useful_tok_s=sum(self.useful.values()) / total,
            slot_tok_s=sum(self.slots.values()) / total,
            step_s=total / sum(self.counts.values()),
            flop_s=sum(self.counts[s] * self.flops[s] for s in seconds) / total,
            fill=sum(self.useful.values()) / sum(self.slots.values()),
            shapes=len(seconds),
        )

    def matmul_share(self, clock: str, reps: int = 5) -> dict:
        """Step seconds at the epoch's most frequent shape, and its dots' seconds each timed alone (`dot_seconds`)."""
        shape = max(self.counts, key=self.counts.get)
        hlo = (
            self.trainer.step_fn.lower(self.state, self.trainer.put_batch(self.batches[shape][0]), self.rng)
            .compile()
            .as_text()
        )
        dots_s, dots_flops, dots = dot_seconds(hlo, reps, clock)
        calls = iter(range(10**9))
        step_s = median_ms(lambda: self.run_step(shape, next(calls)), reps, clock=clock, warmup=1) / 1e3
        return dict(shape=shape, step_s=step_s, dots_s=dots_s, dots=dots, dot_flop_s=dots_flops / dots_s)


def run_peer(args, size: str) -> dict:
    """The peer's training step (`bench.flax_wmt_step` under `args.peer_python`): its JSON line, with useful tokens/s.

    `args`: wmt_dir, peer_python, clock, and optionally peer_steps (0: 10 small, 5 base), peer_rows,
    peer_dtype, peer_profile_dir.
    """
    steps = getattr(args, "peer_steps", 0) or {"small": 10, "base": 5}.get(size, 3)
    cmd = ["--wmt_dir", flax_wmt_dir(args.wmt_dir), "--size", size, "--steps", str(steps)]
    cmd += ["--batch", str(args.peer_rows)] if getattr(args, "peer_rows", 0) else []
    cmd += ["--dtype", args.peer_dtype] if getattr(args, "peer_dtype", "") else []
    cmd += ["--profile_dir", str(args.peer_profile_dir)] if getattr(args, "peer_profile_dir", "") else []
    out = run_json_script(args.peer_python, "bench.flax_wmt_step", cmd, args.clock)
    out["useful_tok_s"] = out["slot_tok_s"] * out["target_nonpad"]
    return out


class OursDecode:
    """Our side of the decode comparison: `models.beam_search` jitted for a source batch, compiled for
    every batch shape of the sources it is given.

    `toy`: a toy model (a dry run); `model_overrides`: `TransformerConfig` fields replaced after the
    config chose them (`with_fields`); `search`: the beam search jitted, called as `models.beam_search`
    (None: `models.beam_search`; bench/decode_ablation.py passes one with a piece taken out), each
    decoder its own jitted program.
    """

    def __init__(
        self,
        dtype: str,
        vocab,
        src_ids,
        batch: int,
        steps: int,
        beam: int,
        pad_to: int = 0,
        toy: bool = False,
        model_overrides: dict | None = None,
        search: Callable | None = None,
    ):
        import jax
        import jax.numpy as jnp

        from configs import default
        from models import beam_search
        from training import config as config_lib
        from training.data.batching import BatchSchedule, bucket_length

        config = default.get_config()
        config.model.update(TOY if toy else SIZES["small"][0])
        self.model = with_fields(config_lib.build_model(config, vocab, dtype), model_overrides)
        tokens = jnp.ones((1, 2), jnp.int32)
        self.params = jax.jit(self.model.init)(jax.random.key(0), tokens, tokens)["params"]
        search = search or beam_search
        self.decode = jax.jit(
            lambda params, src: search(self.model, params, src, beam_size=beam, alpha=0.6, max_len=steps)[0]
        )
        self.batches = []
        for start in range(0, len(src_ids) - batch + 1, batch):
            chunk = [
                ids[:pad_to] if pad_to else ids for ids in src_ids[start : start + batch]
            ]  # the peer cuts to its length too
            length = pad_to or bucket_length(max(map(len, chunk)), config.data.bucket_lengths)
            self.batches.append(jnp.asarray(BatchSchedule.assemble(chunk, [[] for _ in chunk], batch, length).src))
        out = [np.asarray(self.decode(self.params, src)) for src in self.batches]  # compile every shape
        self.rows_with_eos = sum(int((o == self.model.config.eos_id).any(axis=1).sum()) for o in out)
        self.rows = batch * len(self.batches)

    def seconds_per_batch(self, clock: str) -> float:
        """Median over the batches of one batch's seconds (each batch once)."""
        import jax

        batches = iter(self.batches)
        return (
            median_ms(
                lambda: jax.block_until_ready(self.decode(self.params, next(batches))),
                len(self.batches),
                clock=clock,
                warmup=0,
            )
            / 1e3
        )
