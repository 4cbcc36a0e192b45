"""The training run, top to bottom: config -> data -> vocabulary -> batches -> model -> steps -> checkpoints."""

from __future__ import annotations

import functools
import logging
import math
import signal
import sys
import time
from pathlib import Path

import jax
import ml_collections
import numpy as np
import tqdm

from models import Transformer
from training import checkpoints, config as config_lib, data, distributed, parallel, step as step_lib, tokenizer, translate
from training.batching import Batch, BatchSchedule, bucket_length
from training.metrics import MetricsWriter


class NonFiniteLoss(RuntimeError):
    pass


def load_corpus(config, split: str) -> data.Corpus:
    if config.data.dataset == "multi30k":
        return data.load_multi30k(config_lib.data_dir(config), split, config.data.src, config.data.tgt)
    return data.load_tfds(config.data.dataset, split, config.data.src, config.data.tgt, config.data.dir or None)


def build_model(config: ml_collections.ConfigDict, vocab) -> Transformer:
    return Transformer(config_lib.model_config(config, vocab.vocab_size()))


def as_arrays(batch: Batch) -> dict:
    return {"src": batch.src, "tgt_in": batch.tgt_in, "tgt_out": batch.tgt_out, "weights": batch.weights}


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | Path) -> dict:
    """Train (resuming from the workdir's latest checkpoint) and return the last dev metrics.

    With several processes (`training.distributed`) every process runs this; the workdir must be
    shared. Process 0 writes config.json, the vocabulary and the metrics; orbax writes the
    checkpoints from all of them.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    config_lib.validate(config)

    def record_config():
        config_lib.check_resumable(config, workdir / "config.json")
        if distributed.is_main():
            (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))

    distributed.main_first("config", record_config)
    train, dev = load_corpus(config, config.data.train_split), load_corpus(config, config.data.eval_split)
    if config.data.train_limit:
        train = data.Corpus(train.src[: config.data.train_limit], train.tgt[: config.data.train_limit], train.dropped)
    vocab = distributed.main_first("vocabulary", lambda: tokenizer.load_or_train(
        workdir / "spm.model", train.src + train.tgt, config.data.vocab_size, config.seed))
    model = build_model(config, vocab)
    logging.info("train pairs %d (dropped %s), dev pairs %d", len(train), train.dropped, len(dev))

    schedule = BatchSchedule(
        vocab.encode(list(train.src)), vocab.encode(list(train.tgt)),
        token_budget=config.data.token_budget, bucket_lengths=config.data.bucket_lengths, seed=config.seed,
    )
    logging.info("%d batches an epoch; %d pairs longer than the largest bucket dropped", schedule.batches_per_epoch, schedule.examples_dropped)
    dev_set = dev_batches(config, vocab, dev)

    rng_params, rng_dropout = jax.random.split(jax.random.key(config.seed))
    tx = step_lib.make_optimizer(config.optimizer)
    trainer = parallel.make_trainer(config, model, tx)
    _log_batch_split(schedule, trainer.data_shards)
    state = trainer.init_state(rng_params, schedule.batch(0))
    ckpts = checkpoints.Checkpoints(workdir, config.keep_checkpoints)
    restored, start = ckpts.restore_latest(trainer.to_checkpoint(state))
    if restored is not None:
        state = trainer.from_checkpoint(restored)
        logging.info("resumed from step %d", start)
    n_params = step_lib.parameter_count(trainer.to_checkpoint(state).params)
    logging.info("model parameters: %d", n_params)

    eval_step = jax.jit(functools.partial(step_lib.eval_step, apply_fn=model.apply))
    writer = MetricsWriter(workdir, resume_step=start)
    learning_rate = step_lib.learning_rate_schedule(config.optimizer.learning_rate, config.optimizer.warmup_steps)
    stop = _StopFlag()
    dev_metrics: dict = {}
    window = _Window()
    progress = tqdm.tqdm(total=config.num_train_steps, initial=start, unit="step", disable=not (sys.stderr.isatty() and distributed.is_main()))
    started = time.monotonic()
    try:
        for step in range(start, config.num_train_steps):
            t0 = time.perf_counter()
            batch = schedule.batch(step)
            t1 = time.perf_counter()
            state, metrics = trainer.step(state, trainer.put_batch(as_arrays(batch)), rng_dropout)
            metrics = jax.device_get(metrics)  # also waits for the step: honest step times
            loss = float(metrics["loss"])
            if not math.isfinite(loss):
                raise NonFiniteLoss(
                    f"loss is {loss} at step {step}; stopping. The last good checkpoint is kept in {workdir / 'checkpoints'}"
                )
            window.add(t1 - t0, time.perf_counter() - t1, float(metrics["tokens"]), batch.padding_fraction, metrics)
            done = step + 1
            out_of_time, stop_requested = distributed.agree(
                bool(config.max_train_seconds) and time.monotonic() - started >= config.max_train_seconds, stop.requested)
            last = done == config.num_train_steps or out_of_time
            progress.update()
            progress.set_postfix(loss=f"{loss:.3f}", refresh=False)
            if done % config.log_every_steps == 0 or last:
                record = window.flush(done, float(learning_rate(step)))
                writer.write(record)
                eta = (config.num_train_steps - done) * record["step_time_s"]
                logging.info("step %d/%d %s eta %.0fs", done, config.num_train_steps, " ".join(f"{k} {v:.4g}" for k, v in record.items() if k != "step"), eta)
            evaluate_now = done % config.eval_every_steps == 0 or last
            checkpoint_now = done % config.checkpoint_every_steps == 0 or last or stop_requested
            if evaluate_now or checkpoint_now:  # the loss above predates this update: check its result
                _check_finite(state.params, done, workdir)
            if evaluate_now:
                dev_metrics = evaluate(config, model, trainer.local_params(state.params), vocab, dev, dev_set, eval_step, done)
                writer.write(dev_metrics)
                logging.info("dev %s", dev_metrics)
                ckpts.save_if_best(done, trainer.to_checkpoint(state), dev_metrics["loss"])
            if checkpoint_now:
                ckpts.save(done, trainer.to_checkpoint(state))
            if out_of_time:
                logging.info("max_train_seconds (%s) reached at step %d: evaluated, checkpointed, stopping", config.max_train_seconds, done)
                break
            if stop_requested:
                logging.info("stop requested (signal %s): checkpoint saved at step %d, exiting", stop.signum, done)
                break
    finally:
        progress.close()
        stop.restore()
        writer.close()
        ckpts.close()
    return dev_metrics


def dev_batches(config, vocab, dev) -> list[dict]:
    """Dev pairs in fixed-shape bucketed batches (every pair once, none dropped)."""
    limit = config.model.max_len
    src = [ids[:limit] for ids in vocab.encode(list(dev.src))]
    tgt = [ids[: limit - 1] for ids in vocab.encode(list(dev.tgt))]  # + BOS / EOS
    by_bucket: dict[int, list[int]] = {}
    for i, (s, t) in enumerate(zip(src, tgt)):
        by_bucket.setdefault(bucket_length(max(len(s), len(t) + 1), config.data.bucket_lengths), []).append(i)
    batches = []
    for length, ids in sorted(by_bucket.items()):
        rows = max(1, config.data.token_budget // length)
        for k in range(0, len(ids), rows):
            chunk = ids[k : k + rows]
            batches.append(as_arrays(BatchSchedule.assemble([src[i] for i in chunk], [tgt[i] for i in chunk], rows, length)))
    return batches


def dev_loss(params, batches, eval_step) -> float:
    """Mean per-token NLL over fixed-shape batches."""
    sums = [eval_step(params, b) for b in batches]
    return sum(float(s["nll_sum"]) for s in sums) / sum(float(s["tokens"]) for s in sums)


def evaluate(config, model, params, vocab, dev, batches, eval_step, step) -> dict:
    """Dev loss and perplexity over the whole dev split; greedy sacreBLEU on its first `eval.bleu_examples`."""
    nll = dev_loss(params, batches, eval_step)
    n = config.eval.bleu_examples or len(dev)
    hyps = translate.translate(
        model, params, vocab.encode(list(dev.src[:n])), beam_size=1, alpha=config.eval.alpha,
        max_extra_length=config.eval.max_extra_length, bucket_lengths=config.data.bucket_lengths,
    )
    bleu, _ = translate.corpus_bleu(vocab.decode(hyps), dev.tgt[:n])
    return {"step": step, "split": config.data.eval_split, "loss": nll, "perplexity": math.exp(nll), "bleu": bleu, "bleu_examples": n}


def _log_batch_split(schedule, data_shards):
    """Rows a batch and a data shard per bucket length (a batch's rows are padded to a multiple of the shards)."""
    rows = {length: n for length, n, _ in schedule.buckets}
    per_device = {length: -(-n // data_shards) for length, n in rows.items()}
    logging.info("batch rows by bucket length %s; per data shard (%d shards) %s", rows, data_shards, per_device)


@jax.jit
def _all_finite(params):
    return jax.numpy.all(jax.numpy.stack([jax.numpy.isfinite(x).all() for x in jax.tree.leaves(params)]))


def _check_finite(params, step, workdir):
    """Never checkpoint a state that has gone non-finite: the last saved one stays the last good one."""
    if not bool(_all_finite(params)):
        raise NonFiniteLoss(
            f"parameters are not finite after step {step}; stopping. The last good checkpoint is kept in {workdir / 'checkpoints'}"
        )


class _Window:
    """Accumulates per-step timings and metrics between two log lines."""

    def __init__(self):
        self.rows = []

    def add(self, data_s, step_s, tokens, padding, metrics):
        self.rows.append((data_s, step_s, tokens, padding, float(metrics["loss"]), float(metrics["nll"]), float(metrics["grad_norm"])))

    def flush(self, step, learning_rate) -> dict:
        data_s, step_s, tokens, padding, loss, nll, grad_norm = np.array(self.rows).T
        self.rows = []
        total = data_s.sum() + step_s.sum()
        return {
            "step": step, "loss": float(loss.mean()), "nll": float(nll.mean()), "learning_rate": learning_rate,
            "grad_norm": float(grad_norm.mean()), "tokens_per_s": float(tokens.sum() / total),
            "step_time_s": float(total / len(loss)), "data_fraction": float(data_s.sum() / total),
            "padding_fraction": float(padding.mean()),
        }


class _StopFlag:
    """SIGTERM/SIGINT set a flag; the loop saves a checkpoint and leaves at the end of the step."""

    def __init__(self):
        self.requested, self.signum = False, None
        self.previous = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum, frame):
        self.requested, self.signum = True, signum

    def restore(self):
        for s, handler in self.previous.items():
            signal.signal(s, handler)
