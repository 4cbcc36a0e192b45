"""Several seeds of one config trained as one program, each writing the workdir a run of its own writes.

`train_stacked` is `loop.train_and_evaluate` for S seeds at once: one vocabulary and one prepared split, each
seed its own schedule (its data order), initialisation and dropout key, the train step vmapped over them
(`training.parallel.stacked`). The stacked state is checkpointed in the stack's workdir with the seeds still
training, so a killed job resumes bit-identically. Each seed's workdir gets what a single run's holds
(config.json with its seed, the vocabulary, metrics.jsonl, TensorBoard, best/ and, at its last step,
checkpoints/), so eval.py, `sweep.py collect` and a single-run resume read it as any run. A seed whose loss
diverges stops alone: its divergence is recorded in its workdir and its updates are masked from then on.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from training import checkpoints, config as config_lib, prepared
from training.core import compile_cache, files, lock, precision, step as step_lib
from training.core.errors import RunRefused
from training.core.metrics import MetricsWriter
from training.core.progress import Bar
from training.data import tokenizer
from training.data.batching import BatchSchedule, as_arrays, dev_batches
from training.data.corpus import Corpus
from training.data.prefetch import Prefetch
from training.evaluation import dev as dev_lib
from training.parallel import stacked
from training.run import loop
from training.run.divergence import all_finite, loss_watch, record_divergence
from training.run.stopping import StopFlag, interrupted_evaluation, log_stop_during_evaluation, stopping
from training.run.window import Window, compile_summary
from training.run.workdir import LOCK_FILE, PREPARED_FILE, check_writable

STACK_FILE = "stack.json"  # in the stack's workdir: its seeds, in order (a resume must name the same)
STACKED_FILE = "stacked.json"  # in each seed's workdir: the stack that trains it, and its seeds
GIB = 2**30


class SeedsDiverged(RunRefused):
    """One or more stacked seeds diverged (each stopped alone; the others trained on)."""


def seed_config(config, seed: int):
    """`config` as seed `seed`'s own run (what that seed's config.json holds)."""
    config = config.copy_and_resolve_references()
    config.seed = seed
    return config


def check_stack(config, seeds: list[int], seed_dirs: list[Path]) -> None:
    """ValueError naming the field unless `seeds` can train stacked under `config` into `seed_dirs`."""
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"stacked seeds {list(seeds)}; expected one or more distinct seeds")
    if len(seed_dirs) != len(seeds):
        raise ValueError(f"{len(seed_dirs)} seed workdirs for {len(seeds)} stacked seeds; expected one a seed")
    if not config.data.pack_length:
        raise ValueError(
            "config.data.pack_length = 0 (length buckets): stacked seeds need one batch shape a step; expected a "
            "packed config (data.pack_length > 0, e.g. a Table 3 sweep's :packed variant)"
        )
    if config.parallelism != "jit":
        raise ValueError(f"config.parallelism = {config.parallelism!r}; stacked seeds train under 'jit' only")


def check_resumable_stack(workdir: Path, seeds: list[int]) -> None:
    """RunRefused if `workdir` holds a stacked job of other seeds (or of another count of them)."""
    path = workdir / STACK_FILE
    if path.is_file():
        saved = json.loads(path.read_text())["seeds"]
        if saved != list(seeds):
            raise RunRefused(
                f"{workdir} holds a stacked job of seeds {saved} (--stack_seeds {len(saved)}); got seeds "
                f"{list(seeds)} (--stack_seeds {len(seeds)}): resume it with its seeds, or use another --workdir"
            )


def train_stacked(
    config, seeds: list[int], workdir: Path, seed_dirs: list[Path], vocab_proto: bytes | None = None, devices=None
) -> list[dict | None]:
    """Train `seeds` of `config` stacked, resuming from `workdir`'s latest stacked checkpoint; seed i's run files go
    to `seed_dirs[i]`. Returns each seed's last dev metrics ({} if none ran; None for a seed that diverged).

    vocab_proto: every seed's vocabulary (a sweep's shared one); None: the one `prepared` trains for config.seed.
    devices: default all; `stacked.layout` lays the seeds over them. Nothing is written until every check, the
    compile and its memory check included, has passed.
    """
    entered = time.monotonic()
    config_lib.validate(config)
    config_lib.check_max_len(config)
    workdir, seed_dirs = Path(workdir), [Path(d) for d in seed_dirs]
    check_stack(config, seeds, seed_dirs)
    check_writable(workdir)
    configs = [seed_config(config, s) for s in seeds]
    for seed_config_, seed_dir in zip(configs, seed_dirs):
        config_lib.check_resumable(seed_config_, seed_dir / "config.json")
    check_resumable_stack(workdir, seeds)
    if why := lock.refusal(workdir / LOCK_FILE):
        raise lock.DirectoryInUse(why)
    cache = compile_cache.enable(config.compilation_cache_dir)
    with compile_cache.CompileCounter() as compiles:
        try:
            run = _prepare(config, configs, workdir, cache, vocab_proto, devices)
            workdir.mkdir(parents=True, exist_ok=True)
            with lock.held(workdir / LOCK_FILE):
                _write_workdirs(config, configs, workdir, seed_dirs, run)
                return _train(config, configs, seed_dirs, workdir, run, compiles, entered)
        finally:
            logging.info("compilation in this invocation: %s", compile_summary(compiles.totals()))


@dataclasses.dataclass
class _Stack:
    """A stacked job's inputs, every one checked before a workdir is written."""

    dev: Corpus
    data: prepared.Prepared
    vocab: object
    run_info: dict
    model: object
    schedules: list[BatchSchedule]  # one a seed: its own data order
    dev_set: list
    rng_dropout: jax.Array  # [seeds] keys
    trainer: stacked.StackedTrainer
    state: object  # the stacked train state, every leaf [seeds, ...]


def _prepare(config, configs, workdir: Path, cache, vocab_proto: bytes | None, devices) -> _Stack:
    """Data, vocabulary, model, schedules, trainer and stacked state; both steps compiled and their memory checked."""
    dev = loop.nonempty(config, "eval_split")
    given = (workdir / "spm.model").read_bytes() if (workdir / "spm.model").exists() else vocab_proto
    data = prepared.prepare(config, vocab_proto=given)
    if not data.manifest["pairs"]:
        raise ValueError(f"config.data.train_split {config.data.train_split!r} has no sentence pairs")
    vocab = tokenizer.load(data.vocab_proto)
    _, run_info = precision.run_dtype(config.model.dtype, workdir, cache, matmul=config.model.matmul)
    model = config_lib.build_model(config, vocab, run_info["model.dtype"]["dtype"])
    schedules = [prepared.schedule(c, data) for c in configs]
    seeds = len(configs)
    tx = step_lib.make_optimizer(config.optimizer, config.num_train_steps)
    trainer = stacked.StackedTrainer(model, tx, config.optimizer.label_smoothing, seeds, devices)
    # each seed's (params, dropout) keys exactly as its single run splits them (loop._prepare), in one program
    keys = jax.jit(jax.vmap(lambda seed: jax.random.split(jax.random.key(seed))))(
        jnp.asarray([c.seed for c in configs])
    )
    state = trainer.init_state(keys[:, 0], schedules[0].batch(0))
    needs = trainer.compile(state, trainer.put_batch([as_arrays(s.batch(0)) for s in schedules]), keys[:, 1])
    _check_memory(needs, trainer)
    if note := stacked.idle_note(seeds, trainer.mesh.devices.size, schedules[0].shape(0)[0]):
        logging.warning("%s", note)
    logging.info(
        "%d seeds stacked on mesh %s: the train step needs %.2f GiB a device",
        seeds,
        dict(trainer.mesh.shape),
        needs / GIB,
    )
    return _Stack(
        dev, data, vocab, run_info, model, schedules, dev_batches(config, vocab, dev), keys[:, 1], trainer, state
    )


def device_memory(device) -> int | None:
    """Bytes a program may use on `device`: an accelerator's own limit, a CPU's physical memory (None: unknown)."""
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    if device.platform == "cpu" and hasattr(os, "sysconf"):
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None


def _check_memory(needs: int, trainer: stacked.StackedTrainer) -> None:
    """ValueError if the compiled stacked step needs more memory than a device of its mesh holds."""
    device = trainer.mesh.devices.flat[0]
    limit = device_memory(device)
    if limit is None or needs <= limit:
        return
    seed_shards = trainer.mesh.shape[stacked.SEED]
    a_seed = needs / (trainer.seeds / seed_shards)  # memory grows with the seeds a device holds
    fits = max(0, math.floor(limit / a_seed)) * seed_shards
    raise ValueError(
        f"--stack_seeds {trainer.seeds}: the stacked train step needs {needs / GIB:.2f} GiB a device, a "
        f"{device.device_kind} holds {limit / GIB:.2f} GiB (planned memory); about {fits} seeds fit on "
        f"{trainer.mesh.devices.size} device(s)"
    )


def _write_workdirs(config, configs, workdir: Path, seed_dirs: list[Path], run: _Stack) -> None:
    """The stack's workdir (its seeds, config, run info, vocabulary) and each seed's, as a single run writes its own."""
    seeds = [c.seed for c in configs]
    stack = {"seeds": seeds, "seed_workdirs": [str(d) for d in seed_dirs], "mesh": dict(run.trainer.mesh.shape)}
    files.write_atomic(workdir / STACK_FILE, json.dumps(stack, indent=2))
    prepared_record = json.dumps(
        {"directory": str(run.data.directory), "manifest_sha256": run.data.manifest_sha256}, indent=2
    )
    for directory, c in [(workdir, config), *zip(seed_dirs, configs)]:
        directory.mkdir(parents=True, exist_ok=True)
        files.write_atomic(directory / "config.json", c.to_json_best_effort(indent=2))
        files.write_atomic(directory / precision.RUN_INFO, json.dumps(run.run_info, indent=2))
        files.write_atomic(directory / "spm.model", run.data.vocab_proto)
        files.write_atomic(directory / PREPARED_FILE, prepared_record)
    for directory in seed_dirs:
        files.write_atomic(directory / STACKED_FILE, json.dumps({"stack": str(workdir), "seeds": seeds}, indent=2))


def _train(config, configs, seed_dirs: list[Path], workdir: Path, run: _Stack, compiles, entered: float) -> list:
    """Train every seed from the stack's latest checkpoint to the last step (or a stop); evaluate, checkpoint."""
    seeds = len(configs)
    ckpts = checkpoints.Checkpoints(workdir, config.keep_checkpoints)
    own = [checkpoints.Checkpoints(d, config.keep_checkpoints) for d in seed_dirs]  # each seed's best/ and last step
    writers: list[MetricsWriter] = []
    try:
        restored, start = ckpts.restore_latest({"train": run.state, "active": np.ones(seeds, np.int32)})
        state, active = run.state, np.ones(seeds, bool)
        if restored is not None:
            state, active = restored["train"], np.asarray(restored["active"]).astype(bool)
            logging.info("resumed from step %d; seeds still training: %s", start, _named(configs, active))
        writers = [MetricsWriter(d, resume_step=start) for d in seed_dirs]
        job = _Job(config, configs, seed_dirs, run, ckpts, own, writers, compiles, active)
        return job.train(state, start, entered)
    finally:
        for writer in writers:
            writer.close()
        for c in [ckpts, *own]:
            c.close()


def _named(configs, active) -> str:
    return ", ".join(str(c.seed) for c, a in zip(configs, active) if a) or "none"


class _Job:
    """The stacked loop's state: each seed's writer, loss watch, log window and own checkpoints, and which train."""

    def __init__(self, config, configs, seed_dirs, run: _Stack, ckpts, own, writers, compiles, active):
        self.config, self.configs, self.seed_dirs, self.run = config, configs, seed_dirs, run
        self.ckpts, self.own, self.writers, self.active = ckpts, own, writers, active
        self.watches = [loss_watch(c, w, None) for c, w in zip(configs, writers)]
        self.windows = [Window(compiles) for _ in configs]
        self.compiles = compiles
        self.dev_metrics: list[dict | None] = [{} for _ in configs]
        self.eval_step = dev_lib.eval_step_fn(run.model)
        self.finite = jax.jit(jax.vmap(lambda params: all_finite(params)))

    def train(self, state, start: int, entered: float) -> list:
        config, run = self.config, self.run
        learning_rate = jax.jit(step_lib.learning_rate_schedule(config.optimizer, config.num_train_steps))
        stop = StopFlag()
        redo = [i for i, w in enumerate(self.writers) if self.active[i] and interrupted_evaluation(config, w, start)]
        if redo:
            logging.info("the dev evaluation at step %d was interrupted: redoing it", start)
            if not self._evaluate(state, start, stop, only=redo):
                return self._result()
        batches = Prefetch(
            lambda step: [s.batch(step) for s in run.schedules], start, config.num_train_steps, depth=loop.PREFETCH
        )
        progress = Bar(total=config.num_train_steps, initial=start, unit="step", disable=not sys.stderr.isatty())
        started = time.monotonic()
        try:
            for step in range(start, config.num_train_steps):
                state = self._step(state, step, batches)
                if step == start:
                    first = time.monotonic() - entered
                    for window in self.windows:
                        window.first_step_s = first
                    logging.info(
                        "first step done %.1fs after the start; compilation so far: %s",
                        first,
                        compile_summary(self.compiles.totals()),
                    )
                stop.catch()
                done = step + 1
                out_of_time = bool(config.max_train_seconds) and time.monotonic() - started >= config.max_train_seconds
                last = done == config.num_train_steps or out_of_time
                progress.update()
                if done % config.log_every_steps == 0 or last:
                    self._log(done, float(learning_rate(step)))
                evaluate_now = done % config.eval_every_steps == 0 or last
                checkpoint_now = done % config.checkpoint_every_steps == 0 or last or stop.requested
                if evaluate_now or checkpoint_now:
                    self._check_finite(state, done)
                if evaluate_now and not self._evaluate(state, done, stop):
                    self.ckpts.save(done, self._checkpoint(state))
                    log_stop_during_evaluation(stop, done)
                    break
                if checkpoint_now:
                    self.ckpts.save(done, self._checkpoint(state))
                if last and done == config.num_train_steps:
                    self._save_own(state, done)
                if stopping(config, done, out_of_time, stop.requested, stop):
                    break
                if not self.active.any():
                    logging.error("every stacked seed has diverged: stopping at step %d", done)
                    break
        finally:
            batches.close()
            progress.close()
            stop.restore()
        return self._result()

    def _step(self, state, step: int, batches: Prefetch):
        """Step `step` of every seed (the stopped ones' states kept); each active seed's loss checked and logged."""
        t0 = time.perf_counter()
        host = batches.get(step)
        t1 = time.perf_counter()
        logged = (step + 1) % self.config.log_every_steps == 0
        batch = self.run.trainer.put_batch([as_arrays(b) for b in host])
        state, metrics = self.run.trainer.step(state, batch, self.run.rng_dropout, self.active, logged)
        metrics = jax.device_get(metrics)  # also waits for the step
        t2 = time.perf_counter()
        for i in np.flatnonzero(self.active):
            loss = float(metrics["loss"][i])
            if (why := self.watches[i].check(loss)) is not None:
                self._diverge(i, f"{why} at step {step + 1}")
                continue
            one = {name: value[i] for name, value in metrics.items()}
            self.windows[i].add(t1 - t0, t2 - t1, float(one["tokens"]), host[i].padding_fraction, one)
        return state

    def _log(self, done: int, learning_rate: float) -> None:
        for i in np.flatnonzero(self.active):
            record = self.windows[i].flush(done, learning_rate)
            self.writers[i].write(record)
            logging.info(
                "seed %d: step %d/%d %s",
                self.configs[i].seed,
                done,
                self.config.num_train_steps,
                " ".join(f"{k} {v:.4g}" for k, v in record.items() if k != "step"),
            )

    def _check_finite(self, state, done: int) -> None:
        """A seed whose parameters went non-finite stops (its last saved best stays its last good one)."""
        finite = np.asarray(self.finite(state.params))
        for i in np.flatnonzero(self.active & ~finite):
            self._diverge(i, f"parameters are not finite after step {done}")

    def _evaluate(self, state, done: int, stop, only=None) -> bool:
        """Each active seed's dev metrics at `done`, recorded, its best/ updated; False if a stop signal came."""
        host = jax.device_get(state)
        for i in only if only is not None else np.flatnonzero(self.active):
            seed_state = jax.tree.map(lambda leaf, i=i: leaf[i], host)
            result = dev_lib.dev_metrics(
                self.configs[i],
                self.run.model,
                seed_state.params,
                self.run.vocab,
                self.run.dev,
                self.run.dev_set,
                self.eval_step,
                done,
                stop=lambda: stop.requested,
            )
            if result is None:
                return False
            if not math.isfinite(result["perplexity"]):
                self._diverge(i, f"dev loss {result['loss']:g} at step {done} overflows its perplexity")
                continue
            self.writers[i].write(result)
            logging.info("seed %d: dev %s", self.configs[i].seed, result)
            self.own[i].save_if_best(done, seed_state, result["loss"])
            self.dev_metrics[i] = result
        return True

    def _save_own(self, state, done: int) -> None:
        """Each active seed's last state as step `done` of its own checkpoints/: its workdir is a whole run."""
        host = jax.device_get(state)
        for i in np.flatnonzero(self.active):
            self.own[i].save(done, jax.tree.map(lambda leaf, i=i: leaf[i], host))

    def _checkpoint(self, state) -> dict:
        return {"train": state, "active": self.active.astype(np.int32)}

    def _diverge(self, i: int, why: str) -> None:
        """Seed i stops alone: masked from the next step on, its divergence recorded in its workdir."""
        self.active[i] = False
        self.dev_metrics[i] = None
        record_divergence(self.seed_dirs[i], self.watches[i].lowest, self.own[i])
        logging.error(
            "seed %d diverged: %s; its updates are masked from here, the other seeds (%s) go on",
            self.configs[i].seed,
            why,
            _named(self.configs, self.active),
        )

    def _result(self) -> list:
        return [m if a else None for m, a in zip(self.dev_metrics, self.active)]
