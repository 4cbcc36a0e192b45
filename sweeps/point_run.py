"""One point of a sweep, in the process `sweep.py point` starts: train it (resuming), measure it, store its files.

A point trains in WORKDIR/KEYVALUE_seedK under a lock (`LOCK_FILE`: two sweeps never train one point
at once), on the sweep's one vocabulary (`shared_vocabulary`), its wall time kept in `TIMING_FILE`
(sweeps/timer.py); once trained to its last step it is evaluated (`measure`: beam 4 on the dev and
test splits, decoding speed) and its small files go to RESULTS_DIR/NAME/ (sweeps/store.py).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import jax
from absl import logging

from training import config as config_lib
from training.core import files, precision, provenance, step as step_lib
from training.core.lock import claim, release
from training import prepared
from training.data.corpus import load_corpus
from training.evaluation import evaluate
from training.evaluation.loaded import load_run
from training.run import loop, stacked_run
from training.run.divergence import DIVERGED_FILE
from training.run.workdir import PREPARED_FILE, move_run_aside
from sweeps import adopt, schema, store, timer
from sweeps.schema import Point, Stack

TIMING_FILE = "train_seconds.json"
LOCK_FILE = "running.lock"


def run_point(
    config_path: str,
    workdir: Path,
    point: Point,
    results_dir: Path,
    cache_dir: Path | None = None,
    restart: bool = False,
) -> dict | None:
    """Train (resuming) and evaluate one point, then store its files under RESULTS_DIR/NAME; a finished
    point returns its stored result, one that another live process is running, or whose training
    stopped before its last step, returns None (and stores nothing). `cache_dir`: the sweep's
    compilation cache, which config.compilation_cache_dir 'auto' then names (the config stays 'auto').
    `restart`: start the point afresh, the run its workdir holds moved to WORKDIR/NAME/previous/TIME/
    (a run the training refuses to resume, e.g. one killed before its first checkpoint)."""
    if cache_dir is not None:
        jax.config.update("jax_compilation_cache_dir", str(cache_dir))  # what 'auto' resolves to first
    module = schema.load_module(config_path)
    out = schema.sweep_dir(results_dir, module)
    result_path = store.point_dir(out, point) / store.RESULT_FILE
    adopt.adopt_shared(module, [point], results_dir)
    if result_path.exists():
        return json.loads(result_path.read_text())
    config = module.get_config(point.arg)
    config.seed = point.seed
    run_dir = Path(workdir) / point.name
    run_dir.mkdir(parents=True, exist_ok=True)
    why = claim(run_dir / LOCK_FILE)
    if why is not None:
        logging.warning("%s: leaving the point to the lock's holder", why)
        return None
    # the code and the releases this process loaded, not whatever is checked out or installed when it ends
    commit = {**store.git_commit(), **provenance.environment()}
    try:
        vocabulary = shared_vocabulary(config, out)
        if restart:  # here, not through the training's own restart, which would train the run its own vocabulary
            move_run_aside(run_dir, keep=(LOCK_FILE,))
        if not (run_dir / "spm.model").exists():
            files.write_atomic(run_dir / "spm.model", vocabulary.read_bytes())
        timer.timed(run_dir / TIMING_FILE, lambda: loop.train_and_evaluate(config, run_dir))
        trained = max((r["step"] for r in files.read_jsonl(run_dir / "metrics.jsonl") if "split" not in r), default=0)
        if trained < config.num_train_steps:  # stopped early (SIGTERM, max_train_seconds): not a finished point
            logging.warning(
                "%s stopped at step %d of %d: not evaluated or stored; a later start resumes it",
                run_dir,
                trained,
                config.num_train_steps,
            )
            return None
        result = _store(module, out, point, run_dir, commit)
    finally:
        release(run_dir / LOCK_FILE)
    return result


def run_stack(
    config_path: str, workdir: Path, stack: Stack, results_dir: Path, cache_dir: Path | None = None
) -> list[dict | None]:
    """Train the seeds of one point as one program (`training.run.stacked_run`) in WORKDIR/STACK (each seed's run in
    WORKDIR/STACK/KEYVALUE_seedK), then evaluate and store each seed as `run_point` stores a run of its own, its
    result.json saying that it trained stacked and with which seeds. Returns each seed's stored result (None: not
    stored, the job stopped early or another process holds it); a seed that diverged is not stored, and the
    call raises once the others are (stacked_run.SeedsDiverged)."""
    if cache_dir is not None:
        jax.config.update("jax_compilation_cache_dir", str(cache_dir))
    module = schema.load_module(config_path)
    out = schema.sweep_dir(results_dir, module)
    adopt.adopt_shared(module, list(stack.points), results_dir)
    stored = [store.point_dir(out, p) / store.RESULT_FILE for p in stack.points]
    if all(path.exists() for path in stored):
        return [json.loads(path.read_text()) for path in stored]
    config = module.get_config(stack.arg)
    stack_dir = Path(workdir) / stack.name
    seed_dirs = [stack_dir / p.name for p in stack.points]
    stack_dir.mkdir(parents=True, exist_ok=True)
    why = claim(stack_dir / LOCK_FILE)
    if why is not None:
        logging.warning("%s: leaving the stacked seeds to the lock's holder", why)
        return [None] * len(stack.points)
    commit = {**store.git_commit(), **provenance.environment()}
    results: list[dict | None] = []
    try:
        vocabulary = shared_vocabulary(config, out).read_bytes()
        timer.timed(
            stack_dir / TIMING_FILE,
            lambda: stacked_run.train_stacked(config, stack.seeds, stack_dir, seed_dirs, vocab_proto=vocabulary),
        )
        layout = json.loads((stack_dir / stacked_run.STACK_FILE).read_text())
        diverged = []
        for point, run_dir, path in zip(stack.points, seed_dirs, stored):
            if path.exists():
                results.append(json.loads(path.read_text()))
                continue
            trained = max(
                (r["step"] for r in files.read_jsonl(run_dir / "metrics.jsonl") if "split" not in r), default=0
            )
            if (run_dir / DIVERGED_FILE).exists() and trained < config.num_train_steps:
                diverged.append(point.seed)
                results.append(None)
                continue
            if trained < config.num_train_steps:
                logging.warning(
                    "%s stopped at step %d of %d: not evaluated or stored; a later start resumes it",
                    stack_dir,
                    trained,
                    config.num_train_steps,
                )
                return [None] * len(stack.points)
            # the job's wall time, which its seeds share (each seed's own files as a single run's)
            files.write_atomic(run_dir / TIMING_FILE, (stack_dir / TIMING_FILE).read_bytes())
            trained_with = {
                "seeds": stack.seeds,
                "mesh": layout["mesh"],
                "train_seconds": "the stacked job's wall time, shared by its seeds",
            }
            results.append(_store(module, out, point, run_dir, commit, {"stacked": trained_with}))
        if diverged:
            raise stacked_run.SeedsDiverged(
                f"{stack.name}: seed(s) {', '.join(map(str, diverged))} diverged (WORKDIR/{stack.name}/ their "
                f"{DIVERGED_FILE}); the other seeds are stored"
            )
    finally:
        release(stack_dir / LOCK_FILE)
    return results


def _store(module, out: Path, point: Point, run_dir: Path, commit: dict, extra: dict | None = None) -> dict:
    """Evaluate the finished run in `run_dir` and store it as `point` (result.json, hypotheses, small files)."""
    result = {
        "point": point.arg,
        "value": point.value,
        "seed": point.seed,
        **measure(run_dir, module.SWEEP_TEST_SPLIT),
        **commit,
        # the prepared training data it read (training.prepared): its manifest, by hash
        "prepared_manifest_sha256": json.loads((run_dir / PREPARED_FILE).read_text())["manifest_sha256"],
        **(extra or {}),
    }
    if module.SWEEP_TEST_SPLIT and not store.references_path(out, module.SWEEP_TEST_SPLIT).exists():
        config = module.get_config(point.arg)
        references = load_corpus(config, module.SWEEP_TEST_SPLIT).tgt
        files.write_atomic(store.references_path(out, module.SWEEP_TEST_SPLIT), "".join(r + "\n" for r in references))
    store.save_point(out, point, run_dir, result)
    return result


def shared_vocabulary(config, out: Path) -> Path:
    """The sweep's one SentencePiece model (seed 0, the training split), trained on first use."""
    path = out / store.VOCABULARY_FILE
    if not path.exists():
        config_lib.validate(config)
        out.mkdir(parents=True, exist_ok=True)
        # Atomic: two points starting together both write it, identically, and neither reads half a file. The whole
        # split (no data.train_limit), as every committed sweep's; trained once in the prepared-data cache.
        files.write_atomic(path, prepared.vocabulary(config, seed=0, limit=0))
    return path


def measure(run_dir: Path, test_split: str | None) -> dict:
    """Everything the sweep tables report for one finished run (beam 4 on the dev split and `test_split`)."""
    run = load_run(run_dir)
    config = run.config
    scores = {}
    splits = [("dev", config.data.eval_split)] + ([("test", test_split)] if test_split else [])
    for label, split in splits:
        score = evaluate.score_split(run, split, beam_size=4, workdir=run_dir)
        scores.update(
            {f"{label}_loss": score["loss"], f"{label}_perplexity": score["perplexity"], f"{label}_bleu": score["bleu"]}
        )
    dev = load_corpus(config, config.data.eval_split)
    decoding = evaluate.decoding_speed(
        run.model, run.params, run.vocab.encode(list(dev.src[:64])), config.data.bucket_lengths
    )
    records = files.read_jsonl(run_dir / "metrics.jsonl")
    tokens_per_s = [r["tokens_per_s"] for r in records if "tokens_per_s" in r]
    geometry = run.model.config.geometry
    return {
        "step": run.step,
        "num_heads": geometry.num_heads,
        "num_kv_heads": geometry.num_kv_heads,
        "head_dim": geometry.head_dim,
        "v_head_dim": geometry.v_head_dim,
        "parameters": step_lib.parameter_count(run.params),
        **scores,
        "train_tokens_per_s": statistics.median(tokens_per_s),  # median over log windows: compile windows drop out
        "train_seconds": json.loads((run_dir / TIMING_FILE).read_text())["seconds"],
        "bleu_signature": score["signature"],
        **decoding,
        # the machine that evaluated it (and trained its last stretch): speeds compare within one
        "machine": precision.machine_key(),
    }
