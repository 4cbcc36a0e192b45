"""Config sweeps: one workdir per (point, seed), each an ordinary training run plus a fixed evaluation.

A sweep config module (e.g. configs/ablation_heads.py) is an ordinary config whose argument
`KEY=VALUE` selects a point, plus four names: `SWEEP_NAME` (the results' file stem), `SWEEP_KEY`,
`SWEEP_VALUES` and `SWEEP_TEST_SPLIT` (a held-out split also scored, or None). A point's workdir holds the usual train.py files and, once evaluated,
`result.json`; its presence marks the point finished. All points share one SentencePiece
vocabulary (trained once into the sweep's workdir), so the only differences are the swept field
and the seed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shlex
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from types import ModuleType

from absl import logging

from training import config as config_lib
from training.data import tokenizer
from training.data.corpus import load_corpus
from training.evaluation import evaluate
from training.evaluation.loaded import load_run
from training.run import files, loop, step as step_lib
from training.run.lock import claim

TIMING_FILE = "train_seconds.json"
LOCK_FILE = "running.lock"
RESULT_FILE = "result.json"
SPEC_FILE = "sweep.json"


@dataclasses.dataclass(frozen=True)
class Point:
    key: str
    value: int
    seed: int

    @property
    def name(self) -> str:
        return f"{self.key}{self.value}_seed{self.seed}"

    @property
    def arg(self) -> str:
        return f"{self.key}={self.value}"


def load_module(config_path: str | Path) -> ModuleType:
    """The sweep config module at `config_path`, checked for the three sweep names."""
    path = Path(config_path)
    if not path.is_file():
        raise FileNotFoundError(f"--config {config_path}: no such file")
    spec = importlib.util.spec_from_file_location(f"sweep_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    missing = [n for n in ("SWEEP_NAME", "SWEEP_KEY", "SWEEP_VALUES", "SWEEP_TEST_SPLIT", "get_config") if not hasattr(module, n)]
    if missing:
        raise ValueError(f"{config_path} is not a sweep config: it lacks {', '.join(missing)}")
    return module


def points(module: ModuleType, seeds: int) -> list[Point]:
    if not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"--seeds must be a positive int, got {seeds!r}")
    # Seed-major: a sweep cut short has every value once before it has any twice.
    return [Point(module.SWEEP_KEY, value, seed) for seed in range(seeds) for value in module.SWEEP_VALUES]


def point_command(program: list[str], config_path: str, workdir: Path, point: Point) -> list[str]:
    """`program` (the sweep CLI, e.g. ["python", "sweep.py"]) run on one point: what a cluster scheduler launches."""
    return [*program, "--config", str(config_path), "--workdir", str(workdir), "--point", point.arg, "--seed", str(point.seed)]


def shell_line(command: list[str]) -> str:
    return " ".join(shlex.quote(part) for part in command)


def is_finished(workdir: Path, point: Point) -> bool:
    return (workdir / point.name / RESULT_FILE).exists()


def write_spec(workdir: Path, config_path: str, module: ModuleType, seeds: int) -> None:
    """What `collect` needs to rebuild the tables from the finished runs alone."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec = {"config": str(config_path), "name": module.SWEEP_NAME, "key": module.SWEEP_KEY,
            "values": list(module.SWEEP_VALUES), "seeds": seeds}
    files.write_atomic(workdir / SPEC_FILE, json.dumps(spec, indent=2))


def run_point(config_path: str, workdir: Path, point: Point) -> dict | None:
    """Train (resuming) and evaluate one point; a finished point returns its stored result, one that
    another live process is running returns None."""
    result_path = workdir / point.name / RESULT_FILE
    if result_path.exists():
        return json.loads(result_path.read_text())
    module = load_module(config_path)
    config = module.get_config(point.arg)
    config.seed = point.seed
    run_dir = workdir / point.name
    run_dir.mkdir(parents=True, exist_ok=True)
    owner = claim(run_dir / LOCK_FILE)
    if owner is not None:
        logging.warning("%s is being run by process %s; leaving it to that one", run_dir, owner)
        return None
    try:
        shutil.copyfile(shared_vocabulary(config, workdir), run_dir / "spm.model")
        _timed(run_dir / TIMING_FILE, lambda: loop.train_and_evaluate(config, run_dir))
        result = {"point": point.arg, "value": point.value, "seed": point.seed, **measure(run_dir, module.SWEEP_TEST_SPLIT)}
        files.write_atomic(result_path, json.dumps(result, indent=2))
    finally:
        (run_dir / LOCK_FILE).unlink(missing_ok=True)
    return result


def shared_vocabulary(config, workdir: Path) -> Path:
    """The sweep's one SentencePiece model (seed 0, the training split), trained on first use."""
    path = workdir / "spm.model"
    if not path.exists():
        config_lib.validate(config)
        train = load_corpus(config, config.data.train_split)
        tokenizer.load_or_train(path, train.src + train.tgt, config.data.vocab_size, seed=0)
    return path


def _timed(path: Path, fn) -> None:
    """Run `fn`, adding its wall time to the seconds stored at `path` (so resumed runs add up)."""
    spent = json.loads(path.read_text())["seconds"] if path.exists() else 0.0
    started = time.monotonic()
    try:
        fn()
    finally:
        files.write_atomic(path, json.dumps({"seconds": spent + time.monotonic() - started}))


def measure(run_dir: Path, test_split: str | None) -> dict:
    """Everything the sweep tables report for one finished run (beam 4 on the dev split and `test_split`)."""
    run = load_run(run_dir)
    config = run.config
    scores = {}
    splits = [("dev", config.data.eval_split)] + ([("test", test_split)] if test_split else [])
    for label, split in splits:
        score = evaluate.score_split(run, split, beam_size=4, workdir=run_dir)
        scores.update({f"{label}_loss": score["loss"], f"{label}_perplexity": score["perplexity"], f"{label}_bleu": score["bleu"]})
    dev = load_corpus(config, config.data.eval_split)
    decoding = evaluate.decoding_speed(run.model, run.params, run.vocab.encode(list(dev.src[:64])), config.data.bucket_lengths)
    records = files.read_jsonl(run_dir / "metrics.jsonl")
    tokens_per_s = [r["tokens_per_s"] for r in records if "tokens_per_s" in r]
    geometry = run.model.config.geometry
    return {
        "step": run.step, "num_heads": geometry.num_heads, "num_kv_heads": geometry.num_kv_heads, "head_dim": geometry.head_dim,
        "parameters": step_lib.parameter_count(run.params), **scores,
        "train_tokens_per_s": statistics.median(tokens_per_s),  # median over log windows: compile windows drop out
        "train_seconds": json.loads((run_dir / TIMING_FILE).read_text())["seconds"],
        "bleu_signature": score["signature"], **decoding,
    }


def run_sweep(program: list[str], config_path: str, workdir: Path, seeds: int, jobs: int = 1) -> list[Point]:
    """Run every unfinished point as its own process (`jobs` at a time); return the points that failed.

    Each process is the point's `point_command`, so an interrupted sweep resumes each point from its
    latest checkpoint and skips finished ones; its log goes to WORKDIR/NAME.log.
    """
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"--jobs must be a positive int, got {jobs!r}")
    module = load_module(config_path)
    write_spec(workdir, config_path, module, seeds)
    todo = [p for p in points(module, seeds) if not is_finished(workdir, p)]
    running: list[tuple[Point, subprocess.Popen, object]] = []
    failed: list[Point] = []
    try:
        _drive(program, config_path, workdir, jobs, todo, running, failed)
    finally:  # interrupted: let the running points checkpoint (they save on SIGTERM), then leave
        for _, process, log in running:
            process.terminate()
            process.wait()
            log.close()
    return failed


def _drive(program, config_path, workdir, jobs, todo, running, failed):
    while todo or running:
        while todo and len(running) < jobs:
            point = todo.pop(0)
            log = open(workdir / f"{point.name}.log", "a")
            command = point_command(program, config_path, workdir, point)
            print(f"[sweep] start {point.name}: {shell_line(command)}", flush=True)
            running.append((point, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), log))
        time.sleep(1.0)
        for entry in [e for e in running if e[1].poll() is not None]:
            point, process, log = entry
            running.remove(entry)
            log.close()
            if process.returncode == 0 and not is_finished(workdir, point):
                print(f"[sweep] left {point.name} to the process holding {workdir / point.name / LOCK_FILE}", flush=True)
                continue
            ok = process.returncode == 0
            print(f"[sweep] {'done' if ok else 'FAILED'} {point.name} (exit {process.returncode})", flush=True)
            if not ok:
                failed.append(point)
