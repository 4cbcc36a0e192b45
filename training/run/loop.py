"""The training run, top to bottom: config -> data -> vocabulary -> batches -> model -> steps -> checkpoints.

What it leans on sits beside it: the workdir's files and history (workdir.py), divergence (divergence.py), stop
signals and time limits (stopping.py) and the logged metrics (window.py), each shared with stacked_run.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import sys
import time
from pathlib import Path

import jax
import ml_collections

from training import checkpoints, config as config_lib, prepared
from training.core import compile_cache, files, lock, precision, step as step_lib
from training.core.metrics import MetricsWriter
from training.core.progress import Bar
from training.data import tokenizer
from training.data.batching import BatchSchedule, as_arrays, dev_batches
from training.data.corpus import Corpus, load_corpus
from training.data.prefetch import Prefetch
from training.evaluation import dev as dev_lib
from training.parallel import distributed, trainers
from training.run.divergence import (
    LossWatch,
    NonFiniteLoss,
    check_finite,
    diverged_error,
    loss_watch,
    read_divergence,
    record_divergence,
)
from training.run.stopping import StopFlag, interrupted_evaluation, log_stop_during_evaluation, stopping
from training.run.window import Window, compile_summary
from training.run.workdir import LOCK_FILE, PREPARED_FILE, check_history, check_writable, move_run_aside

# batches the input thread makes ahead of the step (training.data.prefetch): enough to cover an epoch's plan,
# drawn at the first batch of an epoch (results/input_pipeline.md)
PREFETCH = 16


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | Path, restart: bool = False) -> dict:
    """Train (resuming from the workdir's latest intact checkpoint) and return the last dev metrics.

    A workdir that holds a run either resumes it or is refused (RunRefused, saying what to do); it
    never starts over silently. restart: move the run the workdir holds (every file but the lock)
    to `WORKDIR/previous/TIME/` once every check has passed, and start afresh.

    With several processes (`training.parallel.distributed`) every process runs this; the workdir must be
    shared. Process 0 writes config.json, the vocabulary and the metrics; orbax writes the
    checkpoints from all of them. Nothing is written until config, data, batching, mesh and
    model have all been checked: a start that fails leaves the workdir as it was.

    Compiles go through the persistent cache `config.compilation_cache_dir` names; what the run
    compiled, and loaded from that cache instead, is logged and written with the training metrics.
    """
    entered = time.monotonic()
    config_lib.validate(config)
    config_lib.check_max_len(config)
    workdir = Path(workdir)
    check_writable(workdir)  # before the minutes of set-up, not after them
    cache = compile_cache.enable(config.compilation_cache_dir)  # before anything compiles
    with compile_cache.CompileCounter() as compiles:
        try:
            return _train_and_evaluate(config, workdir, cache, compiles, entered, restart)
        finally:
            logging.info("compilation in this invocation: %s", compile_summary(compiles.totals()))


def _train_and_evaluate(
    config, workdir: Path, cache: Path | None, compiles: compile_cache.CompileCounter, entered: float, restart: bool
) -> dict:
    run = _prepare(config, workdir, cache, restart)
    workdir.mkdir(parents=True, exist_ok=True)  # every check has passed
    with lock.held(workdir / LOCK_FILE) if distributed.is_main() else contextlib.nullcontext():
        distributed.main_first("workdir", lambda: _write_workdir(config, workdir, run, restart))
        diverged = read_divergence(workdir)
        ckpts = checkpoints.Checkpoints(workdir, config.keep_checkpoints, protected=diverged.get("kept_step"))
        writer = None
        try:
            restored, start = ckpts.restore_latest(run.trainer.to_checkpoint(run.state))
            if restored is not None:
                run.state = run.trainer.from_checkpoint(restored)
                logging.info("resumed from step %d", start)
            logging.info("model parameters: %d", step_lib.parameter_count(run.trainer.to_checkpoint(run.state).params))
            writer = MetricsWriter(workdir, resume_step=start)
            return _train(config, run, ckpts, writer, start, compiles, entered, diverged.get("lowest_running_loss"))
        finally:
            if writer is not None:
                writer.close()
            ckpts.close()


@dataclasses.dataclass
class _Run:
    """A run's inputs, every one checked before the workdir is written: dev data, vocabulary, model, trainer, state."""

    dev: Corpus
    data: prepared.Prepared  # the training split's prepared arrays and manifest
    vocab: object  # a SentencePiece processor (tokenizer.load)
    vocab_proto: bytes
    reuse_vocab: bool  # the workdir's own vocabulary (a resume), not one trained now
    run_info: dict  # precision.RUN_INFO: how model.dtype was resolved
    model: object
    schedule: BatchSchedule
    dev_set: list
    rng_dropout: jax.Array
    trainer: trainers.MeshTrainer | trainers.PmapTrainer
    state: object  # the train state; replaced by the restored one on a resume


def _prepare(config, workdir: Path, cache: Path | None, restart: bool) -> _Run:
    """Check the config against the workdir, load the data, get the vocabulary, build model, trainer and state."""
    if not restart:  # a restart starts afresh whatever the workdir holds (moved aside by _write_workdir)
        config_lib.check_resumable(config, workdir / "config.json")
        check_history(workdir)
    if distributed.is_main() and (why := lock.refusal(workdir / LOCK_FILE)):  # refuse before the slow checks
        raise lock.DirectoryInUse(why)
    device = jax.devices()[0]
    logging.info(
        "devices: %d x %s (%s), %d process(es)",
        jax.device_count(),
        device.device_kind,
        device.platform,
        jax.process_count(),
    )
    dev = nonempty(config, "eval_split")
    vocab_path = workdir / "spm.model"
    reuse_vocab = vocab_path.exists() and not restart
    # The training split, prepared once for every run on this corpus (training.prepared), encoded with the
    # workdir's vocabulary (a resume, a sweep point) or else the one trained for this corpus and seed: process 0
    # prepares it, the others read it (or prepare the same where the cache is not shared) with its vocabulary.
    given = vocab_path.read_bytes() if reuse_vocab else None
    data = prepared.prepare(config, vocab_proto=given) if distributed.is_main() else None
    vocab_proto = distributed.broadcast_bytes(data.vocab_proto if data is not None else None)
    data = data or prepared.prepare(config, vocab_proto=vocab_proto)
    if not data.manifest["pairs"]:
        raise ValueError(f"config.data.train_split {config.data.train_split!r} has no sentence pairs")
    vocab = tokenizer.load(vocab_proto)
    if not reuse_vocab and vocab.vocab_size() < config.data.vocab_size:  # SentencePiece stops where the text does
        raise ValueError(
            f"config.data.vocab_size = {config.data.vocab_size}; expected at most {vocab.vocab_size()}, "
            f"the pieces SentencePiece finds in {config.data.train_split!r}"
        )
    # Process 0 resolves model.dtype (a measurement may differ between hosts) and every process uses its answer.
    run_info = json.loads(
        distributed.broadcast_bytes(
            json.dumps(
                precision.run_dtype(
                    config.model.dtype, None if restart else workdir, cache, matmul=config.model.matmul
                )[1]
            ).encode()
            if distributed.is_main()
            else None
        )
    )
    dtype = run_info["model.dtype"]["dtype"]
    logging.info(
        "compute dtype %s (config.model.dtype %r; %s)", dtype, config.model.dtype, run_info["model.dtype"]["reason"]
    )
    model = config_lib.build_model(config, vocab, dtype)
    logging.info("train pairs %d (prepared: %s), dev pairs %d", data.manifest["pairs"], data.directory, len(dev))
    schedule = prepared.schedule(config, data)
    logging.info(
        "%d batches an epoch; %d pairs longer than the largest bucket dropped",
        schedule.batches_per_epoch,
        schedule.examples_dropped,
    )
    # one program, not one per eager op (seed, split, unstack): a run's compile count is its few real programs
    rng_params, rng_dropout = jax.jit(lambda: tuple(jax.random.split(jax.random.key(config.seed))))()
    trainer = trainers.make_trainer(config, model, step_lib.make_optimizer(config.optimizer, config.num_train_steps))
    _log_batch_split(schedule, trainer.data_shards)
    state = trainer.init_state(rng_params, schedule.batch(0))
    return _Run(
        dev,
        data,
        vocab,
        vocab_proto,
        reuse_vocab,
        run_info,
        model,
        schedule,
        dev_batches(config, vocab, dev),
        rng_dropout,
        trainer,
        state,
    )


def _write_workdir(config, workdir: Path, run: _Run, restart: bool) -> None:
    """Process 0 writes config.json, the run info and a new vocabulary (after moving a restarted run aside)."""
    if distributed.is_main():
        if restart:
            move_run_aside(workdir)
        files.write_atomic(workdir / "config.json", config.to_json_best_effort(indent=2))
        files.write_atomic(workdir / precision.RUN_INFO, json.dumps(run.run_info, indent=2))
        if not run.reuse_vocab:
            files.write_atomic(workdir / "spm.model", run.vocab_proto)
        files.write_atomic(
            workdir / PREPARED_FILE,
            json.dumps({"directory": str(run.data.directory), "manifest_sha256": run.data.manifest_sha256}, indent=2),
        )


def _train(
    config,
    run: _Run,
    ckpts,
    writer: MetricsWriter,
    start: int,
    compiles: compile_cache.CompileCounter,
    entered: float,
    baseline: float | None = None,
) -> dict:
    """Train from step `start` to the last (or a stop): log, evaluate, checkpoint. The last dev metrics.

    baseline: the lowest running loss a divergence stop recorded (DIVERGED_FILE): a resume watches against it.
    """
    state = run.state
    evaluate = _Evaluator(config, run, ckpts, writer)
    learning_rate = jax.jit(
        step_lib.learning_rate_schedule(config.optimizer, config.num_train_steps)
    )  # logged; jitted: one program, not a dozen eager ops
    stop = StopFlag()
    dev_metrics: dict = {}
    watch = loss_watch(config, writer, baseline)
    if interrupted_evaluation(config, writer, start):
        logging.info("the dev evaluation at step %d was interrupted: redoing it", start)
        dev_metrics = evaluate(state, start, stop) or {}
    window = Window(compiles)
    batches = _prefetch(run, start, config.num_train_steps)
    progress = Bar(  # while it is drawn, the log lines are written around it
        total=config.num_train_steps,
        initial=start,
        unit="step",
        disable=not (sys.stderr.isatty() and distributed.is_main()),
    )
    started = time.monotonic()
    try:
        for step in range(start, config.num_train_steps):
            state, loss = _timed_step(config, run, ckpts, state, step, watch, window, batches)
            if step == start:
                window.first_step_s = time.monotonic() - entered
                logging.info(
                    "first step done %.1fs after the start; compilation so far: %s",
                    window.first_step_s,
                    compile_summary(compiles.totals()),
                )
            stop.catch()
            done = step + 1
            out_of_time, stop_requested = distributed.agree(
                bool(config.max_train_seconds) and time.monotonic() - started >= config.max_train_seconds,
                stop.requested,
            )
            last = done == config.num_train_steps or out_of_time
            progress.update()
            progress.set_postfix(loss=f"{loss:.3f}", refresh=False)
            if done % config.log_every_steps == 0 or last:
                _log_window(config, writer, window.flush(done, float(learning_rate(step))))
            evaluate_now = done % config.eval_every_steps == 0 or last
            checkpoint_now = done % config.checkpoint_every_steps == 0 or last or stop_requested
            if evaluate_now or checkpoint_now:  # the loss above predates this update: check its result
                check_finite(state.params, done, ckpts)
            if evaluate_now:
                result = evaluate(state, done, stop)
                if result is None:  # SIGTERM/SIGINT during it: save now, redo the evaluation on resume
                    ckpts.save(done, run.trainer.to_checkpoint(state))
                    log_stop_during_evaluation(stop, done)
                    break
                dev_metrics = result
            if checkpoint_now:
                ckpts.save(done, run.trainer.to_checkpoint(state))
            if stopping(config, done, out_of_time, stop_requested, stop):
                break
    except NonFiniteLoss:
        record_divergence(Path(ckpts.latest.directory).parent, watch.lowest, ckpts)
        raise
    finally:
        batches.close()
        progress.close()
        stop.restore()
    return dev_metrics


def _prefetch(run: _Run, start: int, stop: int) -> Prefetch:
    """The batches of steps `start` to `stop - 1`, made ahead in a thread: (this process's rows of the batch, the
    batch's row count) each."""

    def make(step: int) -> tuple:
        rows, _ = run.schedule.shape(step)
        return run.schedule.batch(step, rows=run.trainer.local_rows(rows)), rows

    return Prefetch(make, start, stop, depth=PREFETCH)


def _timed_step(
    config, run: _Run, ckpts, state, step: int, watch: LossWatch, window: Window, batches: Prefetch
) -> tuple:
    """Train step `step`: its batch and step times and metrics go to `window`, its loss to `watch` (which stops
    a diverged run). Returns (the new state, the loss). The data time is the wait for the prefetched batch."""
    t0 = time.perf_counter()
    batch, rows = batches.get(step)
    t1 = time.perf_counter()
    logged = (step + 1) % config.log_every_steps == 0  # these steps' metrics hold the gradient norm
    arrays = run.trainer.put_local_batch(as_arrays(batch), rows)
    state, metrics = run.trainer.step(state, arrays, run.rng_dropout, logged)
    metrics = jax.device_get(metrics)  # also waits for the step: honest step times
    loss = float(metrics["loss"])
    if (why := watch.check(loss)) is not None:  # the loss of checkpoint `step`'s parameters
        raise diverged_error(f"{why} at step {step + 1}", ckpts, insane=step)
    window.add(t1 - t0, time.perf_counter() - t1, float(metrics["tokens"]), batch.padding_fraction, metrics)
    return state, loss


class _Evaluator:
    """Dev metrics at a step: recorded, best/ updated; None if a stop signal came during them."""

    def __init__(self, config, run: _Run, ckpts, writer: MetricsWriter):
        self.config, self.run, self.ckpts, self.writer = config, run, ckpts, writer
        self.eval_step = dev_lib.eval_step_fn(run.model)

    def __call__(self, state, done: int, stop: StopFlag) -> dict | None:
        run = self.run
        result = dev_lib.dev_metrics(
            self.config,
            run.model,
            run.trainer.local_params(state.params),
            run.vocab,
            run.dev,
            run.dev_set,
            self.eval_step,
            done,
            stop=lambda: distributed.agree(stop.requested)[0],
        )
        if result is None:
            return None
        if not math.isfinite(result["perplexity"]):  # a finite blow-up: as diverged as a NaN
            raise diverged_error(f"dev loss {result['loss']:g} at step {done} overflows its perplexity", self.ckpts)
        self.writer.write(result)
        logging.info("dev %s", result)
        self.ckpts.save_if_best(done, run.trainer.to_checkpoint(state), result["loss"])
        return result


def _log_window(config, writer: MetricsWriter, record: dict) -> None:
    writer.write(record)
    eta = (config.num_train_steps - record["step"]) * record["step_time_s"]
    logging.info(
        "step %d/%d %s eta %.0fs",
        record["step"],
        config.num_train_steps,
        " ".join(f"{k} {v:.4g}" for k, v in record.items() if k != "step"),
        eta,
    )


def nonempty(config, field: str) -> Corpus:
    corpus = load_corpus(config, config.data[field])
    if not len(corpus):
        raise ValueError(
            f"config.data.{field} {config.data[field]!r} has no sentence pairs (dropped: {corpus.dropped})"
        )
    return corpus


def _log_batch_split(schedule, data_shards):
    """Rows a batch and a data shard per bucket length (a batch's rows are padded to a multiple of the shards)."""
    rows = {length: n for length, n, _ in schedule.buckets}
    per_device = {length: -(-n // data_shards) for length, n in rows.items()}
    logging.info("batch rows by bucket length %s; per data shard (%d shards) %s", rows, data_shards, per_device)
