"""Config sweeps: one workdir per (point, seed), each an ordinary training run plus a fixed evaluation.

A sweep config module (e.g. configs/ablation_heads.py) is an ordinary config whose argument
`KEY=VALUE` selects a point, plus five names: `SWEEP_NAME` (the results' name), `SWEEP_KEY`,
`SWEEP_VALUES` (positive ints, or names such as attention types), `SWEEP_REFERENCE` (the value
every point is compared with) and `SWEEP_TEST_SPLIT` (a held-out split also scored, or None). A
point trains in WORKDIR/KEYVALUE_seedK (KEY_VALUE_seedK for a name; checkpoints,
logs); once evaluated, its small files go to RESULTS_DIR/NAME/ (sweeps/store.py), and a
point whose result.json is there is finished, on whichever machine that directory is checked out.
All points share one SentencePiece vocabulary (RESULTS_DIR/NAME/spm.model), so the only
differences are the swept field and the seed.

A sweep whose points include runs another sweep already holds (rows B's d_k = d_v and the KV
sweep's kv = h are rows A's h = 8; the head-size sweep's h8_dk32 and h32_dk8 are rows A's h = 8 and
h = 32) says so with an optional name `SWEEP_SHARED = {VALUE: (OTHER_NAME, OTHER_VALUE), ...}`, or
`SWEEP_SHARED_REFERENCE = (OTHER_NAME, OTHER_VALUE)` for the reference point alone: the other
sweep's stored seeds are copied in as this sweep's seeds of VALUE (marked `shared_from`) instead of
being trained again, provided both sweeps tokenise with the same vocabulary (this sweep adopts the
other's when it has none yet).

A sweep may also name comparisons between its points besides each against the reference,
`SWEEP_CONTRASTS = ((label, FROM_VALUE, TO_VALUE), ...)`: `--collect` gives them their own
seed-level table (the head-size sweep's decomposition).

A sweep config may offer variants of every point, `SWEEP_VARIANTS = ("packed",)` (the Table 3
sweeps: configs/table3_preset.py): `--config PATH:packed` runs each point with its argument
`KEY=VALUE,packed` and stores it under SWEEP_NAME_packed, apart from the plain points (`variant`).

Seeds are 0, 1, ... unless the config names its first, `SWEEP_FIRST_SEED = K` (seeds K, K + 1, ...):
a replication draws seeds no earlier run used, since a seed fixes the data order and the
initialisation (configs/head_size_blocked.py).

`--points_per_device K` (local launcher) runs K points at a time on each accelerator, each process
seeing one device and a 1/K share of its memory; on a CPU it runs K points at a time. Every point
of a sweep compiles through one persistent compilation cache (`point_environment`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

import jax
from absl import logging

from training import config as config_lib
from training.core import compile_cache, files, precision, provenance, step as step_lib
from training.core.lock import claim, release
from training.data import tokenizer
from training.data.corpus import load_corpus
from training.evaluation import evaluate
from training.evaluation.loaded import load_run
from training.run import loop
from sweeps import store

TIMING_FILE = "train_seconds.json"
LOCK_FILE = "running.lock"
SWEEP_NAMES = ("SWEEP_NAME", "SWEEP_KEY", "SWEEP_VALUES", "SWEEP_REFERENCE", "SWEEP_TEST_SPLIT", "get_config")


@dataclasses.dataclass(frozen=True)
class Point:
    key: str
    value: int | str
    seed: int

    @property
    def name(self) -> str:
        """The point's workdir (and log) name."""
        return f"{store.point_label(self.key, self.value)}_seed{self.seed}"

    @property
    def arg(self) -> str:
        return f"{self.key}={self.value}"


def import_file(config_path: str | Path, flag: str = "--config") -> ModuleType:
    """The Python module at `config_path` (a config file, not a package module)."""
    path = Path(config_path)
    if not path.is_file():
        raise FileNotFoundError(f"{flag} {config_path}: no such file")
    spec = importlib.util.spec_from_file_location(f"sweep_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_module(config_path: str | Path) -> ModuleType:
    """The sweep config module at `config_path` (PATH, or PATH:VARIANT: `variant`), checked for the sweep names
    and their values."""
    path, _, variant_name = str(config_path).partition(":")
    module = import_file(path)
    missing = [n for n in SWEEP_NAMES if not hasattr(module, n)]
    if missing:
        raise ValueError(f"{path} is not a sweep config: it lacks {', '.join(missing)}")
    module = variant(module, variant_name, path) if variant_name else module
    _check(config_path, module)
    return module


def variant(module: ModuleType, name: str, path: str | Path) -> ModuleType:
    """The sweep `module` (a fresh import, changed in place) as its variant `name`, one of its `SWEEP_VARIANTS`
    (the Table 3 sweeps' "packed": configs/table3_preset.py): every point's config argument gains ",NAME"
    (h=8 -> h=8,packed), its results are stored apart, as SWEEP_NAME_NAME, and its shared points are the
    same variant's of the other sweeps (a variant's points compare with that variant's only)."""
    offered = tuple(getattr(module, "SWEEP_VARIANTS", ()))
    if name not in offered:
        raise ValueError(f"--config {path}:{name}: {path} offers the variants {offered} (SWEEP_VARIANTS)")
    get_config = module.get_config
    module.get_config = lambda arg=None: get_config(f"{arg},{name}" if arg else name)
    module.SWEEP_NAME = f"{module.SWEEP_NAME}_{name}"
    if getattr(module, "SWEEP_SHARED_REFERENCE", None) is not None:
        origin, value = module.SWEEP_SHARED_REFERENCE
        module.SWEEP_SHARED_REFERENCE = (f"{origin}_{name}", value)
    if getattr(module, "SWEEP_SHARED", None):
        module.SWEEP_SHARED = {v: (f"{origin}_{name}", value) for v, (origin, value) in module.SWEEP_SHARED.items()}
    return module


def _check(config_path, module: ModuleType) -> None:
    def bad(name, expected):
        return ValueError(f"{config_path}: {name} = {getattr(module, name)!r}; expected {expected}")

    if not isinstance(module.SWEEP_NAME, str) or not re.fullmatch(r"[A-Za-z0-9_-]+", module.SWEEP_NAME):
        raise bad("SWEEP_NAME", "a name of letters, digits, '_' and '-' (it names results/NAME/)")
    if not isinstance(module.SWEEP_KEY, str) or not re.fullmatch(r"[A-Za-z_]+", module.SWEEP_KEY):
        raise bad("SWEEP_KEY", "the config argument's key, letters and '_' only (e.g. 'h')")
    values = module.SWEEP_VALUES
    if (
        not isinstance(values, (tuple, list))
        or not values
        or len(set(values)) != len(values)
        or not (all(map(_is_count, values)) or all(map(_is_name, values)))
    ):
        raise bad(
            "SWEEP_VALUES",
            "a non-empty tuple of distinct positive ints, or of distinct names (lower-case letters, digits, '_')",
        )
    if module.SWEEP_REFERENCE not in values:
        raise bad("SWEEP_REFERENCE", f"one of SWEEP_VALUES {tuple(values)}")
    if module.SWEEP_TEST_SPLIT is not None and not isinstance(module.SWEEP_TEST_SPLIT, str):
        raise bad("SWEEP_TEST_SPLIT", "a split name or None")

    def is_origin(shared):
        return (
            isinstance(shared, tuple)
            and len(shared) == 2
            and isinstance(shared[0], str)
            and re.fullmatch(r"[A-Za-z0-9_-]+", shared[0]) is not None
            and shared[0] != module.SWEEP_NAME
            and (_is_count(shared[1]) or _is_name(shared[1]))
        )

    shared = getattr(module, "SWEEP_SHARED_REFERENCE", None)
    if shared is not None and not is_origin(shared):
        raise bad(
            "SWEEP_SHARED_REFERENCE",
            "None or (another sweep's SWEEP_NAME, its value that is the same run as SWEEP_REFERENCE)",
        )
    many = getattr(module, "SWEEP_SHARED", None)
    if many is not None and not (isinstance(many, dict) and all(v in values and is_origin(o) for v, o in many.items())):
        raise bad(
            "SWEEP_SHARED",
            "None or {a value of SWEEP_VALUES: (another sweep's SWEEP_NAME, its value that is the same run)}",
        )
    if many and shared is not None and module.SWEEP_REFERENCE in many and many[module.SWEEP_REFERENCE] != shared:
        raise bad("SWEEP_SHARED", f"an origin of SWEEP_REFERENCE that agrees with SWEEP_SHARED_REFERENCE {shared!r}")
    contrasts = getattr(module, "SWEEP_CONTRASTS", ())
    if not (
        isinstance(contrasts, tuple)
        and all(
            isinstance(c, tuple)
            and len(c) == 3
            and isinstance(c[0], str)
            and c[0]
            and c[1] in values
            and c[2] in values
            and c[1] != c[2]
            for c in contrasts
        )
    ):
        raise bad("SWEEP_CONTRASTS", "a tuple of (label, a value of SWEEP_VALUES, another value of SWEEP_VALUES)")
    first = getattr(module, "SWEEP_FIRST_SEED", 0)
    if not isinstance(first, int) or isinstance(first, bool) or first < 0:
        raise bad("SWEEP_FIRST_SEED", "an int >= 0, the sweep's first seed")


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _is_name(value) -> bool:
    """A categorical sweep value, such as an attention type."""
    return isinstance(value, str) and re.fullmatch(r"[a-z][a-z0-9_]*", value) is not None


def shared_points(module: ModuleType) -> dict[int | str, tuple[str, int | str]]:
    """{value: (other sweep's name, its value)} for every point that is another sweep's run."""
    shared = dict(getattr(module, "SWEEP_SHARED", None) or {})
    if getattr(module, "SWEEP_SHARED_REFERENCE", None) is not None:
        shared.setdefault(module.SWEEP_REFERENCE, module.SWEEP_SHARED_REFERENCE)
    return shared


def points(module: ModuleType, seeds: int) -> list[Point]:
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        raise ValueError(f"--seeds must be a positive int, got {seeds!r}")
    first = getattr(module, "SWEEP_FIRST_SEED", 0)
    # Seed-major: a sweep cut short has every value once before it has any twice.
    return [
        Point(module.SWEEP_KEY, value, seed) for seed in range(first, first + seeds) for value in module.SWEEP_VALUES
    ]


def sweep_dir(results_dir: str | Path, module: ModuleType) -> Path:
    return Path(results_dir) / module.SWEEP_NAME


def parse_point(arg: str, seed: int, module: ModuleType) -> Point:
    """The point `--point KEY=VALUE --seed K` names, checked against the sweep config."""
    key, _, text = arg.partition("=")
    value = int(text) if text.isdigit() else text
    if key != module.SWEEP_KEY or value not in module.SWEEP_VALUES:
        raise ValueError(f"--point {arg!r}: expected {module.SWEEP_KEY}=<one of {tuple(module.SWEEP_VALUES)}>")
    if seed < 0:
        raise ValueError(f"--seed must be >= 0, got {seed}")
    return Point(key, value, seed)


def point_command(
    program: list[str], config_path: str, workdir: Path, results_dir: Path, point: Point, cache_dir: Path | None = None
) -> list[str]:
    """`program` (the sweep CLI, e.g. ["python", "sweep.py"]) run on one point: what a scheduler launches.
    `cache_dir`: the sweep's one persistent compilation cache (`sweep_cache_dir`), for points whose config says 'auto'."""
    cache = ["--compilation_cache_dir", str(cache_dir)] if cache_dir else []
    return [
        *program,
        "--config",
        str(config_path),
        "--workdir",
        str(workdir),
        "--results_dir",
        str(results_dir),
        *cache,
        "--point",
        point.arg,
        "--seed",
        str(point.seed),
    ]


def sweep_cache_dir() -> Path | None:
    """The persistent compilation cache every point of a sweep started here compiles through: what
    config.compilation_cache_dir 'auto' means in this process, resolved once, so that points with the same
    shapes compile each program once between them, wherever a launcher runs them (a shared filesystem)."""
    return compile_cache.cache_dir("auto")


def slot_environments(
    platform: str, devices: int, points_per_device: int, visible: str | None = None
) -> list[dict[str, str]]:
    """One environment per point that may run at once: `points_per_device` per accelerator, each process seeing
    one device (CUDA_VISIBLE_DEVICES, an entry of `visible` when the sweep itself was limited to some) and a
    1/K share of its memory (XLA_PYTHON_CLIENT_MEM_FRACTION, 95 % of it split K ways); on a CPU, K plain slots."""
    if not isinstance(points_per_device, int) or isinstance(points_per_device, bool) or points_per_device < 1:
        raise ValueError(f"--points_per_device must be a positive int, got {points_per_device!r}")
    if platform == "cpu":
        return [{} for _ in range(points_per_device)]
    if platform != "gpu":
        raise ValueError(
            f"--points_per_device: the local launcher shares GPUs or a CPU between point processes, got platform {platform!r}"
        )
    ids = [i.strip() for i in visible.split(",") if i.strip()] if visible else [str(i) for i in range(devices)]
    fraction = f"{0.95 / points_per_device:.3f}"
    return [
        {"CUDA_VISIBLE_DEVICES": device, "XLA_PYTHON_CLIENT_MEM_FRACTION": fraction}
        for _ in range(points_per_device)
        for device in ids[:devices]
    ]


def local_devices() -> tuple[str, int]:
    """(platform, device count) of this machine, asked of a child process so that this one never takes GPU memory."""
    done = subprocess.run(
        [sys.executable, "-c", "import jax; print(jax.default_backend(), jax.local_device_count())"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
    )
    if done.returncode != 0:
        raise RuntimeError(f"could not list this machine's JAX devices: {done.stderr.strip().splitlines()[-1:]}")
    platform, count = done.stdout.split()[-2:]
    return platform, int(count)


def shell_line(command: list[str]) -> str:
    return " ".join(shlex.quote(part) for part in command)


def write_spec(results_dir: Path, config_path: str, module: ModuleType, seeds: int) -> None:
    """What `--collect` needs besides the points' files: the swept values and the reference point."""
    spec = {
        "config": str(config_path),
        "name": module.SWEEP_NAME,
        "key": module.SWEEP_KEY,
        "values": list(module.SWEEP_VALUES),
        "reference": module.SWEEP_REFERENCE,
        "test_split": module.SWEEP_TEST_SPLIT,
        "seeds": seeds,
        "contrasts": [list(c) for c in getattr(module, "SWEEP_CONTRASTS", ())],
    }
    store.write_spec(sweep_dir(results_dir, module), spec)


def unfinished(module: ModuleType, seeds: int, results_dir: Path) -> list[Point]:
    return [p for p in points(module, seeds) if not store.is_finished(sweep_dir(results_dir, module), p)]


def pending(results_dir: Path, config_path: str, module: ModuleType, seeds: int) -> list[Point]:
    """What a start of the sweep has left to train: writes sweep.json, adopts shared points' seeds."""
    write_spec(results_dir, config_path, module, seeds)
    adopt_shared(module, points(module, seeds), results_dir)
    return unfinished(module, seeds, results_dir)


def adopt_shared(module: ModuleType, wanted: list[Point], results_dir: Path) -> list[Point]:
    """Store, for each point in `wanted` that another sweep already holds as the same run (`shared_points`),
    that sweep's files as this point's; return the points so stored."""
    shared = shared_points(module)
    out = sweep_dir(results_dir, module)
    adopted = []
    for origin_name in dict.fromkeys(name for name, _ in shared.values()):
        source = Path(results_dir) / origin_name
        if not _same_vocabulary(out, source):
            continue
        source_spec = store.read_spec(source)
        split = source_spec.get("test_split")
        if split and store.references_path(source, split).exists() and not store.references_path(out, split).exists():
            files.write_atomic(store.references_path(out, split), store.references_path(source, split).read_bytes())
        source_key = source_spec["key"]
        for point in wanted:
            if shared.get(point.value, (None,))[0] != origin_name or store.is_finished(out, point):
                continue
            origin = store.point_path(source, source_key, shared[point.value][1], point.seed)
            if (origin / store.RESULT_FILE).exists():
                store.share_point(out, point, origin, f"{origin_name}/{origin.parent.name}/{origin.name}")
                adopted.append(point)
    return adopted


def adopt_stored(module: ModuleType, results_dir: Path) -> list[Point]:
    """`adopt_shared` for every seed the other sweeps have stored of this sweep's shared points, however many
    seeds this sweep was started with: how rows A's later seeds reach the sweeps that share its runs."""
    store.read_spec(sweep_dir(results_dir, module))  # a sweep never started has no spec to collect: say so here
    wanted = []
    for value, (origin_name, origin_value) in shared_points(module).items():
        source = Path(results_dir) / origin_name
        if not (source / store.SPEC_FILE).exists():
            continue
        origin = source / store.point_label(store.read_spec(source)["key"], origin_value)
        seeds = sorted(int(d.name[4:]) for d in origin.glob("seed*") if d.name[4:].isdigit())
        wanted += [Point(module.SWEEP_KEY, value, seed) for seed in seeds]
    return adopt_shared(module, wanted, results_dir)


def _same_vocabulary(out: Path, source: Path) -> bool:
    """Whether sweep `out` tokenises as sweep `source` does, adopting the source's vocabulary when `out` has none."""
    vocabulary, source_vocabulary = out / store.VOCABULARY_FILE, source / store.VOCABULARY_FILE
    if not source_vocabulary.exists():
        return False
    if not vocabulary.exists():
        out.mkdir(parents=True, exist_ok=True)
        files.write_atomic(vocabulary, source_vocabulary.read_bytes())
    if vocabulary.read_bytes() != source_vocabulary.read_bytes():
        logging.warning(
            "%s and %s tokenise differently: the shared points are trained, not copied", vocabulary, source_vocabulary
        )
        return False
    return True


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
    module = load_module(config_path)
    out = sweep_dir(results_dir, module)
    result_path = store.point_dir(out, point) / store.RESULT_FILE
    adopt_shared(module, [point], results_dir)
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
            loop.move_run_aside(run_dir, keep=(LOCK_FILE,))
        if not (run_dir / "spm.model").exists():
            files.write_atomic(run_dir / "spm.model", vocabulary.read_bytes())
        _timed(run_dir / TIMING_FILE, lambda: loop.train_and_evaluate(config, run_dir))
        trained = max((r["step"] for r in files.read_jsonl(run_dir / "metrics.jsonl") if "split" not in r), default=0)
        if trained < config.num_train_steps:  # stopped early (SIGTERM, max_train_seconds): not a finished point
            logging.warning(
                "%s stopped at step %d of %d: not evaluated or stored; a later start resumes it",
                run_dir,
                trained,
                config.num_train_steps,
            )
            return None
        result = {
            "point": point.arg,
            "value": point.value,
            "seed": point.seed,
            **measure(run_dir, module.SWEEP_TEST_SPLIT),
            **commit,
        }
        if module.SWEEP_TEST_SPLIT and not store.references_path(out, module.SWEEP_TEST_SPLIT).exists():
            references = load_corpus(config, module.SWEEP_TEST_SPLIT).tgt
            files.write_atomic(
                store.references_path(out, module.SWEEP_TEST_SPLIT), "".join(r + "\n" for r in references)
            )
        store.save_point(out, point, run_dir, result)
    finally:
        release(run_dir / LOCK_FILE)
    return result


def shared_vocabulary(config, out: Path) -> Path:
    """The sweep's one SentencePiece model (seed 0, the training split), trained on first use."""
    path = out / store.VOCABULARY_FILE
    if not path.exists():
        config_lib.validate(config)
        train = load_corpus(config, config.data.train_split)
        out.mkdir(parents=True, exist_ok=True)
        # Atomic: two points starting together both train it, identically, and neither reads half a file.
        files.write_atomic(path, tokenizer.train(train.src + train.tgt, config.data.vocab_size, seed=0))
    return path


def _timed(path: Path, fn, every_s: float = 30.0) -> None:
    """Run `fn`, adding its wall time to the seconds stored at `path` (so resumed runs add up).

    The total is also rewritten every `every_s` seconds: a process killed with no chance to clean
    up (SIGKILL, a machine restart) loses at most that much of its time, not all of it.
    """
    spent = json.loads(path.read_text())["seconds"] if path.exists() else 0.0
    started = time.monotonic()
    save = lambda: files.write_atomic(path, json.dumps({"seconds": spent + time.monotonic() - started}))
    stop = threading.Event()

    def keep_saving():
        while not stop.wait(every_s):
            save()

    saver = threading.Thread(target=keep_saving, daemon=True)
    saver.start()
    try:
        fn()
    finally:
        stop.set()
        saver.join()
        save()


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
        "machine": precision.machine_key(),  # the machine that evaluated it (and trained its last stretch): speeds compare within one
    }


def run_sweep(
    program: list[str],
    config_path: str,
    workdir: Path,
    results_dir: Path,
    seeds: int,
    jobs: int = 1,
    points_per_device: int | None = None,
) -> list[Point]:
    """Run every unfinished point as its own process on this machine (`jobs` at a time, or `points_per_device`
    on each accelerator: `slot_environments`); return the points that failed.

    Each process is the point's `point_command`, so an interrupted sweep resumes each point from its
    latest checkpoint and skips finished ones; its log goes to WORKDIR/KEYVALUE_seedK.log. Every point
    compiles through one persistent cache (`sweep_cache_dir`).
    """
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise ValueError(f"--jobs must be a positive int, got {jobs!r}")
    if points_per_device is None:
        slots = [{} for _ in range(jobs)]
    elif jobs != 1:
        raise ValueError(
            f"--jobs {jobs} and --points_per_device {points_per_device}: give one (points_per_device sets how many run)"
        )
    else:
        slots = slot_environments(*local_devices(), points_per_device, os.environ.get("CUDA_VISIBLE_DEVICES"))
    module = load_module(config_path)
    todo = pending(results_dir, config_path, module, seeds)
    Path(workdir).mkdir(parents=True, exist_ok=True)
    running: list[tuple[Point, subprocess.Popen, object, int]] = []
    failed: list[Point] = []
    # SIGTERM's default action ends this process at once and would orphan the points, which train on;
    # as an exit, it reaches the `finally` below, which passes it on and waits for their checkpoints.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        _drive(
            program,
            config_path,
            Path(workdir),
            Path(results_dir),
            sweep_dir(results_dir, module),
            slots,
            todo,
            running,
            failed,
        )
    finally:  # interrupted: let the running points checkpoint (they save on SIGTERM), then leave
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the wait short
        for _, process, log, _ in running:
            process.terminate()
        for _, process, log, _ in running:
            process.wait()
            log.close()
        signal.signal(signal.SIGTERM, previous)
    return failed


def _drive(program, config_path, workdir, results_dir, out, slots, todo, running, failed):
    cache_dir = sweep_cache_dir()
    while todo or running:
        while todo and len(running) < len(slots):
            point = todo.pop(0)
            slot = min(set(range(len(slots))) - {entry[3] for entry in running})
            log = open(workdir / f"{point.name}.log", "a")
            command = point_command(program, config_path, workdir, results_dir, point, cache_dir)
            shown = " ".join(f"{k}={v}" for k, v in slots[slot].items())
            print(f"[sweep] start {point.name}: {shown + ' ' if shown else ''}{shell_line(command)}", flush=True)
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **slots[slot]})
            running.append((point, process, log, slot))
        time.sleep(1.0)
        for entry in [e for e in running if e[1].poll() is not None]:
            point, process, log, _ = entry
            running.remove(entry)
            log.close()
            if process.returncode == 0 and not store.is_finished(out, point):
                print(
                    f"[sweep] left {point.name} to the process holding {workdir / point.name / LOCK_FILE}", flush=True
                )
                continue
            ok = process.returncode == 0
            print(f"[sweep] {'done' if ok else 'FAILED'} {point.name} (exit {process.returncode})", flush=True)
            if not ok:
                failed.append(point)
