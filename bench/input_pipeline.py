"""The training input pipeline at WMT14's size: prepare, schedule, batches per host, prefetch, and a first step.

    python -m bench.make_corpus --pairs 4500000 --out /tmp/wmt_sized                 # reads $MULTI30K_DIR
    taskset -c 1 python -m bench.input_pipeline --corpus /tmp/wmt_sized --child_cpus 0,1 \
        --parts prepare,train,schedule,batches,old,train_cold          # prints the prepared-data cache it made
    taskset -c 1 /tmp/grainvenv/bin/python -m bench.input_pipeline --corpus /tmp/wmt_sized --prepared CACHE \
        --parts executors                                               # an interpreter with Grain: its rows too

CORPUS_DIR (`--corpus`) is a corpus in Multi30k's layout ({train,val,test_2016_flickr}.{de,en}.gz). Parts:

- prepare: `python prepare.py --config configs/default.py` in a child (`MULTI30K_DIR=CORPUS_DIR`,
  a fresh `HEADCOUNT_PREPARED` unless `--prepared` names one): wall seconds, the vocabulary's and the encoding's
  share (its log lines), and peak memory (the largest process's RSS, and the process tree's summed PSS).
- schedule: seconds to read the prepared arrays back (`prepared.prepare` on the ready cache: it hashes every
  array) and to build each schedule: bucketed, packed with the packing plan computed, packed with it cached.
- batches: ms a `schedule.batch(step, rows=...)` for host 0's share of H hosts (ceil(rows / H) rows, as
  `trainer.local_rows` splits a batch), `--steps` steps centred on the end of the first epoch; the epoch plans
  (drawn once an epoch) timed apart. Bucketed: the Table 3 preset (configs/ablation_heads.py:h=8, eleven bucket
  lengths, 1,024 slots); packed: configs/default.py (64-token rows, 2,048 slots).
- executors: the loop's input wait against a fake step (a sleep of `--step_ms`) while an executor makes the
  real batches (H = 1) ahead: `Prefetch` (the loop's), and, where Grain is importable, Grain's MapDataset over
  the same function with threads or worker processes. Each in a fresh child process: start-up (constructed to
  first batch), wait per step, peak memory of its process tree.
- old: the schedule before the prepared arrays (commit 0517fea's training/data/batching.py, which draws the
  epoch's plan again for every batch and pads token lists in Python) on the same tokens (slices of the arrays
  for its token lists: 4.5M pairs of Python int lists would not fit), H = 1, `--old_steps` batches.
- train: `train.py --config configs/default.py --config.num_train_steps=20` in a child, with the data prepared
  and (`train_cold`) with an empty cache (the run prepares first): seconds to the first step (process start to
  the "first step done" line, and metrics.jsonl's `first_step_s`, from train_and_evaluate's entry), peak memory.
  Each run has a fresh workdir and compilation cache (so the first step includes its compiles).

Times are wall-clock unless marked cpu (this process's CPU time).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench.lib import ROOT, cpu_description
from training.core.markdown import markdown_table
from training.data.batching import Tokens

CONFIGS = {"bucketed": "configs/ablation_heads.py:h=8", "packed": "configs/default.py"}
HOSTS = (1, 8, 64)
PARTS = ("prepare", "schedule", "batches", "executors", "old", "train", "train_cold")
KEPT = "+kept"  # an executor's name ending so makes its batches with the lengths computed once (KeptLengths)
EXECUTORS = ("prefetch", "prefetch+kept", "grain_threads_1", "grain_threads_2", "grain_mp_1", "grain_mp_2")
OLD_COMMIT = "0517fea"  # the last commit whose schedule held token lists and drew an epoch's plan every batch


# --- children and their memory ---------------------------------------------------------------------


class Memory:
    """Peak memory of a process tree, sampled every `every` seconds in a thread: the largest process's RSS and
    the tree's summed PSS (shared pages, the memory-mapped arrays among them, counted once), in bytes."""

    def __init__(self, pid: int, every: float = 0.1):
        import psutil

        self.root, self.every, self.rss, self.pss = psutil.Process(pid), every, 0, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._done.is_set():
            try:
                tree = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                return
            rss = pss = 0
            for process in tree:
                try:
                    info = process.memory_full_info()
                except psutil.Error:
                    continue
                rss, pss = max(rss, info.rss), pss + info.pss
            self.rss, self.pss = max(self.rss, rss), max(self.pss, pss)
            self._done.wait(self.every)

    def stop(self) -> dict:
        self._done.set()
        self._thread.join()
        return {"peak_rss_gb": self.rss / 2**30, "peak_pss_gb": self.pss / 2**30}


def child(command: list[str], env: dict, cpus: str, marks: dict[str, str]) -> dict:
    """Run `command` from the repository root (pinned to `cpus` where given): its wall seconds, peak memory, the
    seconds from its start at which each of `marks` (name: regex) first appeared in its output, and that output."""
    if cpus:
        command = ["taskset", "-c", cpus, *command]
    started, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    process = subprocess.Popen(
        command, cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    memory = Memory(process.pid)
    seen, lines = {}, []
    for line in process.stdout:
        lines.append(line)
        for name, pattern in marks.items():
            if name not in seen and re.search(pattern, line):
                seen[name] = time.perf_counter() - started
    process.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = sum(getattr(after, f) - getattr(before, f) for f in ("ru_utime", "ru_stime"))
    result = {"wall_s": time.perf_counter() - started, "cpu_s": cpu_s, **memory.stop(), "marks": seen}
    result["output"] = "".join(lines)
    if process.returncode:
        raise RuntimeError(f"{' '.join(command)} failed ({process.returncode}):\n{''.join(lines[-30:])}")
    return result


def config_of(spec: str, pairs: int):
    """The config `spec` ("configs/NAME.py[:ARG]") with data.train_limit = `pairs`."""
    path, _, arg = spec.partition(":")
    config = importlib.import_module(path.removesuffix(".py").replace("/", ".")).get_config(arg or None)
    config.data.train_limit = pairs
    return config


# --- prepare, schedules, batches ---------------------------------------------------------------------


def run_prepare(args, cache: Path) -> dict:
    command = [sys.executable, "prepare.py", "--config", CONFIGS["packed"]]
    command += [f"--config.data.train_limit={args.pairs}"]
    marks = {"vocabulary": r"vocabulary trained in", "encoded": r"prepared \S+ in"}
    result = child(command, {"MULTI30K_DIR": args.corpus, "HEADCOUNT_PREPARED": str(cache)}, args.child_cpus, marks)
    found = re.search(r"vocabulary trained in (\d+)s", result["output"])
    encoded = re.search(r"prepared \S+ in (\d+)s", result["output"])
    summary = json.loads(result["output"].strip().splitlines()[-1])
    return {
        **{k: result[k] for k in ("wall_s", "cpu_s", "peak_rss_gb", "peak_pss_gb")},
        "vocabulary_s": int(found.group(1)) if found else None,
        "encode_s": int(encoded.group(1)) if encoded else None,
        "pairs": summary["pairs"],
        "tokens": summary["tokens"],
        "directory": summary["directory"],
    }


def timed(function, *args, **kwargs) -> tuple[object, float, float]:
    """(function's result, wall seconds, this process's CPU seconds)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def settings_of(config) -> dict:
    return dict(
        token_budget=config.data.token_budget,
        bucket_lengths=tuple(config.data.bucket_lengths),
        seed=config.seed,
        pack_length=config.data.pack_length,
    )


def schedules(args, cache: Path) -> tuple[dict, list]:
    """({kind: schedule}, [(what, wall s, cpu s)]): the data read back and each schedule built, timed."""
    from training import prepared
    from training.data.batching import BatchSchedule

    rows, built = [], {}
    for kind, spec in CONFIGS.items():
        config = config_of(spec, args.pairs)
        data, *took = timed(prepared.prepare, config, cache)
        rows.append((f"{kind}: read the prepared arrays back (their hashes checked)", *took))
        if not config.data.pack_length:
            built[kind], *took = timed(prepared.schedule, config, data)
            rows.append((f"{kind}: build the schedule", *took))
            continue
        if list(data.directory.glob(f"packing-seed{config.seed}-len{config.data.pack_length}-*.npz")):
            _, *took = timed(BatchSchedule, data.src, data.tgt, **settings_of(config))  # computed, not written
            rows.append((f"{kind}: build the schedule, packing plan computed", *took))
        else:
            _, *took = timed(prepared.schedule, config, data)
            rows.append((f"{kind}: build the schedule, packing plan computed (and cached)", *took))
        built[kind], *took = timed(prepared.schedule, config, data)
        rows.append((f"{kind}: build the schedule, packing plan cached (read and checked)", *took))
    return built, rows


@dataclasses.dataclass(frozen=True)
class KeptLengths(Tokens):
    """`Tokens` with each sentence's length computed once: `Tokens.lengths` is `np.diff(offsets)`, over the whole
    corpus, at every access (twice a batch). What a batch costs without that recomputation."""

    kept: np.ndarray | None = None

    @classmethod
    def of(cls, tokens: Tokens) -> KeptLengths:
        return cls(tokens.tokens, tokens.offsets, np.diff(tokens.offsets))

    @property
    def lengths(self) -> np.ndarray:
        return self.kept


def lengths_kept(schedule, settings: dict):
    """`schedule` over the same arrays with `KeptLengths`."""
    from training.data.batching import BatchSchedule

    sides = [KeptLengths.of(t) for t in (schedule.src_ids, schedule.tgt_ids)]
    return BatchSchedule(*sides, **settings, packed_rows=schedule.packed_rows)


def first_step(schedule, steps: int) -> int:
    """The first of `steps` steps centred on the end of the first epoch (from step 0 on a short epoch)."""
    return max(0, schedule.batches_per_epoch - steps // 2)


def time_batches(schedule, hosts: int, steps: int) -> dict:
    """ms of host 0's rows of each batch (cpu and wall), and the epoch plans drawn on the way (ms, apart)."""
    first, per_epoch = first_step(schedule, steps), schedule.batches_per_epoch
    schedule.epoch(first // per_epoch + 1000)  # a plan of another epoch: the first one below is drawn afresh
    plans, cpu, wall = [], [], []
    for step in range(first, first + steps):
        if step == first or step % per_epoch == 0:
            _, plan_wall, plan_cpu = timed(schedule.epoch, step // per_epoch)
            plans.append((plan_cpu * 1e3, plan_wall * 1e3))
        rows, _ = schedule.shape(step)
        _, batch_wall, batch_cpu = timed(schedule.batch, step, rows=(0, -(-rows // hosts)))
        cpu.append(batch_cpu * 1e3)
        wall.append(batch_wall * 1e3)
    return {
        "cpu_median_ms": statistics.median(cpu),
        "wall_median_ms": statistics.median(wall),
        "cpu_max_ms": max(cpu),
        "wall_max_ms": max(wall),
        "plans_ms": plans,
    }


def batch_rows(built: dict, steps: int) -> dict:
    """{(schedule, H): time_batches}, for each schedule as it is and with its lengths kept (`lengths_kept`)."""
    rows = {}
    for kind, schedule in built.items():
        kept = lengths_kept(schedule, settings_of(config_of(CONFIGS[kind], 0)))
        for label, timed_schedule in ((kind, schedule), (f"{kind}, lengths kept", kept)):
            for hosts in HOSTS:
                rows[label, hosts] = time_batches(timed_schedule, hosts, steps)
    return rows


# --- executors: the loop's wait against a fake step ------------------------------------------------------


class MakeBatch:
    """`make(step)` as the loop's prefetch makes it (H = 1: the whole batch), opening the prepared arrays on first
    use without hashing them: picklable, so that a worker process opens them itself."""

    def __init__(self, directory: str, settings: dict, packing: str | None, kept: bool = False):
        self.directory, self.settings, self.packing, self.schedule = Path(directory), settings, packing, None
        self.kept = kept  # the sentence lengths computed once (KeptLengths)

    def __getstate__(self):
        return {**self.__dict__, "schedule": None}

    def open(self):
        from training.data.batching import BatchSchedule

        sides = [
            Tokens(
                np.memmap(self.directory / f"{side}.tokens.i32", dtype=np.int32, mode="r"),
                np.fromfile(self.directory / f"{side}.offsets.i64", dtype=np.int64),
            )
            for side in ("src", "tgt")
        ]
        sides = [KeptLengths.of(side) for side in sides] if self.kept else sides
        packed = None
        if self.packing:
            with np.load(self.packing) as saved:
                packed = (saved["ids"], saved["offsets"])
        self.schedule = BatchSchedule(*sides, **self.settings, packed_rows=packed)
        return self.schedule

    def __call__(self, step: int):
        from training.data.batching import as_arrays

        schedule = self.schedule or self.open()
        rows, _ = schedule.shape(step)
        return as_arrays(schedule.batch(step, rows=(0, rows))), rows


def executor_iterator(name: str, make: MakeBatch, first: int, stop: int):
    """(an iterator of the batches of steps first..stop-1 made ahead by executor `name`, a close function)."""
    name = name.removesuffix(KEPT)
    if name == "prefetch":
        from training.data.prefetch import Prefetch
        from training.run.loop import PREFETCH

        prefetch = Prefetch(make, first, stop, depth=PREFETCH)
        return (prefetch.get(step) for step in range(first, stop)), prefetch.close
    import grain

    dataset = grain.MapDataset.range(first, stop).map(make)
    kind, count = name.removeprefix("grain_").rsplit("_", 1)
    if kind == "threads":
        iterable = dataset.to_iter_dataset(grain.ReadOptions(num_threads=int(count), prefetch_buffer_size=4))
    else:
        iterable = dataset.to_iter_dataset(grain.ReadOptions(num_threads=0)).mp_prefetch(
            grain.MultiprocessingOptions(num_workers=int(count), per_worker_buffer_size=2)
        )
    iterator = iter(iterable)
    return iterator, getattr(iterator, "close", lambda: None)


def trial(spec: dict) -> dict:
    """One executor in this process: start-up, wait per step against a sleep of step_ms, peak memory."""
    memory = Memory(os.getpid())
    make = MakeBatch(spec["directory"], spec["settings"], spec["packing"], spec["executor"].endswith(KEPT))
    first, steps, step_s = spec["first"], spec["steps"], spec["step_ms"] / 1e3
    import training.run.loop  # noqa: F401  (JAX and the loop, loaded in a run before its batches are)

    started = time.perf_counter()
    imported = time.perf_counter()
    if spec["executor"].startswith("grain"):
        import grain  # noqa: F401  (its import is part of its start-up)
        from absl import flags

        flags.FLAGS(sys.argv[:1])  # Grain reads its absl flags (its worker processes get their values)

        imported = time.perf_counter()
    batches, close = executor_iterator(spec["executor"], make, first, first + steps)
    waits, first_batch = [], None
    for _ in range(steps):
        w0 = time.perf_counter()
        next(batches)
        waits.append(time.perf_counter() - w0)
        first_batch = first_batch or time.perf_counter()
        time.sleep(step_s)  # the device's step: the host is free meanwhile
    close()
    # the step that starts the next epoch waits for its plan (drawn once an epoch); the others are the steady state
    boundary = spec["per_epoch"] - first if 0 < spec["per_epoch"] - first < steps else None
    steady = [w for i, w in enumerate(waits) if i not in (0, boundary)]
    steady_s = sum(steady) / len(steady)
    boundary_s = waits[boundary] if boundary is not None else 0.0
    return {
        "executor": spec["executor"],
        "import_s": imported - started,
        "startup_s": first_batch - started,
        "window_pct": 100 * sum(waits[1:]) / ((steps - 1) * step_s),
        "steady_pct": 100 * steady_s / step_s,
        "epoch_pct": 100 * (boundary_s + steady_s * (spec["per_epoch"] - 1)) / (spec["per_epoch"] * step_s),
        "boundary_ms": boundary_s * 1e3,
        "wait_max_ms": max(steady) * 1e3,
        **memory.stop(),
    }


def executors(args, cache: Path, names: tuple[str, ...]) -> list[dict]:
    """Each executor in a fresh child (this interpreter, this process's CPUs) for each schedule kind, `--rounds`
    times, every other round in reverse order (the load of a shared machine drifts)."""
    from training import prepared

    rows = []
    for kind, spec in CONFIGS.items():
        config = config_of(spec, args.pairs)
        data = prepared.prepare(config, cache)
        schedule = prepared.schedule(config, data)
        packing = None
        if config.data.pack_length:
            packing = str(next(data.directory.glob(f"packing-seed{config.seed}-len{config.data.pack_length}-*.npz")))
        settings = settings_of(config)
        order = [(r, name) for r in range(args.rounds) for name in (names if r % 2 == 0 else names[::-1])]
        for round_, name in order:
            payload = {
                "executor": name,
                "directory": str(data.directory),
                "settings": settings,
                "packing": packing,
                "first": first_step(schedule, args.steps),
                "per_epoch": schedule.batches_per_epoch,
                "steps": args.steps,
                "step_ms": args.step_ms,
            }
            run = subprocess.run(
                [sys.executable, "-m", "bench.input_pipeline", "--trial", json.dumps(payload)],
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
            if run.returncode:
                error = run.stderr.strip().splitlines()[-1]
                rows.append({"kind": kind, "round": round_ + 1, "executor": name, "error": error})
                continue
            rows.append({"kind": kind, "round": round_ + 1, **json.loads(run.stdout.strip().splitlines()[-1])})
    return sorted(rows, key=lambda r: (list(CONFIGS).index(r["kind"]), names.index(r["executor"]), r["round"]))


# --- the old schedule, and train.py -----------------------------------------------------------------------


class TokenLists:
    """`Tokens` as the token lists the old schedule took (each sentence a slice of the arrays)."""

    def __init__(self, tokens):
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int):
        return self.tokens[i]

    def __iter__(self):
        return (self.tokens[i] for i in range(len(self.tokens)))


def old_module():
    source = subprocess.run(
        ["git", "show", f"{OLD_COMMIT}:training/data/batching.py"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "old_batching.py"
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location("old_batching", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def old_batches(args, cache: Path, built: dict) -> dict:
    """{kind: {build_s, cpu and wall ms per batch}} of the old schedule at H = 1, around the same epoch boundary."""
    from training import prepared

    old = old_module()
    result = {}
    for kind, spec in CONFIGS.items():
        config = config_of(spec, args.pairs)
        data = prepared.prepare(config, cache)
        schedule, build_s, _ = timed(
            old.BatchSchedule, TokenLists(data.src), TokenLists(data.tgt), **settings_of(config)
        )
        first = first_step(built[kind], args.steps) + args.steps // 2 - args.old_steps // 2
        times = [timed(schedule.batch, step)[1:] for step in range(first, first + args.old_steps)]
        result[kind] = {
            "build_s": build_s,
            "cpu_median_ms": statistics.median(c for _, c in times) * 1e3,
            "wall_median_ms": statistics.median(w for w, _ in times) * 1e3,
            "wall_max_ms": max(w for w, _ in times) * 1e3,
        }
    return result


def train_run(args, cache: Path) -> dict:
    """train.py's 20 steps on the corpus with the prepared-data cache `cache`: start-up, first step, memory."""
    scratch = Path(tempfile.mkdtemp(prefix="input_pipeline_train_"))
    command = [sys.executable, "train.py", "--config", CONFIGS["packed"], "--workdir", str(scratch / "run")]
    command += ["--config.num_train_steps=20", f"--config.data.train_limit={args.pairs}"]
    command += [f"--config.compilation_cache_dir={scratch / 'jax_cache'}"]
    marks = {"first_step": r"first step done"}
    try:
        result = child(command, {"MULTI30K_DIR": args.corpus, "HEADCOUNT_PREPARED": str(cache)}, args.child_cpus, marks)
        records = [json.loads(line) for line in (scratch / "run" / "metrics.jsonl").read_text().splitlines()]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {
        "to_first_step_s": result["marks"].get("first_step"),
        "first_step_s": next((r["first_step_s"] for r in records if "first_step_s" in r), None),
        "data_fraction": next((r["data_fraction"] for r in records if "data_fraction" in r), None),
        **{k: result[k] for k in ("wall_s", "cpu_s", "peak_rss_gb", "peak_pss_gb")},
    }


# --- the tables -----------------------------------------------------------------------------------


def print_prepare(r: dict) -> None:
    print("\n### Prepare (`python prepare.py --config configs/default.py`)\n")
    headers = ["pairs", "tokens src / tgt", "wall s", "cpu s (all processes)", "vocabulary s", "encoding s"]
    headers += ["peak RSS GB (largest process)", "peak PSS GB (process tree)"]
    tokens = f"{r['tokens']['src']:,} / {r['tokens']['tgt']:,}"
    row = [f"{r['pairs']:,}", tokens, f"{r['wall_s']:.0f}", f"{r['cpu_s']:.0f}", r["vocabulary_s"], r["encode_s"]]
    row += [f"{r['peak_rss_gb']:.2f}", f"{r['peak_pss_gb']:.2f}"]
    print(markdown_table(headers, [row], "r" * len(headers)))


def print_schedules(rows: list) -> None:
    print("\n### Read back and schedules\n")
    print(markdown_table(["what", "s", "cpu s"], [[w, f"{a:.2f}", f"{c:.2f}"] for w, a, c in rows], "lrr"))


def print_batches(built: dict, rows: dict) -> None:
    print("\n### A batch: host 0's rows of H hosts\n")
    headers = ["schedule", "batches an epoch", "H", "rows (of the largest batch)", "median ms (cpu)", "max ms (cpu)"]
    lines = []
    for (label, hosts), r in rows.items():
        schedule = built[label.split(",")[0]]
        largest = max(n for _, n, _ in schedule.buckets)
        lines.append(
            [label, f"{schedule.batches_per_epoch:,}", hosts, f"{-(-largest // hosts)} of {largest}"]
            + [f"{r[k]:.2f}" for k in ("cpu_median_ms", "cpu_max_ms", "wall_median_ms", "wall_max_ms")]
        )
    print(markdown_table([*headers, "median ms", "max ms"], lines, "lrrrrrrr"))
    print("\n### The epoch's plan (drawn once an epoch: at the start, and at the epoch boundary)\n")
    lines = [
        [label, hosts, *(", ".join(f"{ms[k]:.0f}" for ms in r["plans_ms"]) for k in (0, 1))]
        for (label, hosts), r in rows.items()
    ]
    print(markdown_table(["schedule", "H", "ms (cpu), each plan drawn", "ms"], lines, "lrll"))


def print_old(result: dict) -> None:
    print(f"\n### The old schedule ({OLD_COMMIT}), H = 1\n")
    headers = ["schedule", "build s", "median ms a batch (cpu)", "median ms", "max ms"]
    lines = [
        [kind, f"{r['build_s']:.1f}", *(f"{r[k]:.0f}" for k in ("cpu_median_ms", "wall_median_ms", "wall_max_ms"))]
        for kind, r in result.items()
    ]
    print(markdown_table(headers, lines, "lrrrr"))


def print_executors(rows: list[dict], step_ms: float) -> None:
    print(f"\n### The loop's wait against a {step_ms:g} ms fake step (H = 1)\n")
    headers = ["schedule", "executor", "round", "start-up s (import)", "wait, % of the steps timed"]
    headers += ["steady wait % (max ms)"]
    headers += ["epoch boundary's wait ms", "wait over an epoch %", "peak PSS GB (tree)", "peak RSS GB (largest)"]
    lines = []
    for r in rows:
        if "error" in r:
            lines.append([r["kind"], r["executor"], r["round"], r["error"], *[""] * 6])
            continue
        lines.append(
            [r["kind"], r["executor"], r["round"], f"{r['startup_s']:.2f} ({r['import_s']:.2f})"]
            + [f"{r['window_pct']:.2f}"]
            + [f"{r['steady_pct']:.3f} ({r['wait_max_ms']:.1f})", f"{r['boundary_ms']:.0f}", f"{r['epoch_pct']:.3f}"]
            + [f"{r['peak_pss_gb']:.2f}", f"{r['peak_rss_gb']:.2f}"]
        )
    print(markdown_table(headers, lines, "llrrrrrrrr"))


def print_train(runs: dict) -> None:
    print("\n### train.py --config configs/default.py --config.num_train_steps=20\n")
    headers = ["data", "to the first step s (process start)", "first_step_s (metrics.jsonl)", "wall s", "cpu s"]
    headers += ["peak RSS GB (largest process)", "peak PSS GB (process tree)"]
    lines = [
        [what, f"{r['to_first_step_s']:.1f}", f"{r['first_step_s']:.1f}", f"{r['wall_s']:.0f}", f"{r['cpu_s']:.0f}"]
        + [f"{r['peak_rss_gb']:.2f}", f"{r['peak_pss_gb']:.2f}"]
        for what, r in runs.items()
    ]
    print(markdown_table(headers, lines, "lrrrrrr"))


# --- main ----------------------------------------------------------------------------------------------


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", help="CORPUS_DIR: a corpus in Multi30k's layout (bench/make_corpus.py)")
    parser.add_argument("--pairs", type=int, default=0, help="use the first N training pairs (0: all)")
    parser.add_argument("--prepared", default="", help="a prepared-data cache to use (default: a fresh one)")
    parser.add_argument("--parts", default="prepare,schedule,batches,executors", help=f"of {PARTS}, or 'all'")
    grain = importlib.util.find_spec("grain") is not None
    executors = [e for e in EXECUTORS if grain or not e.startswith("grain")]
    parser.add_argument("--executors", default=",".join(executors), help=f"of {EXECUTORS} (Grain's where importable)")
    parser.add_argument("--steps", type=int, default=200, help="steps timed, centred on the end of the first epoch")
    parser.add_argument("--old_steps", type=int, default=10, help="batches of the old schedule timed")
    parser.add_argument("--step_ms", type=float, default=20.0, help="the fake step's ms (executors)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the executors, alternating their order")
    parser.add_argument("--child_cpus", default="", help="taskset -c for prepare and train.py (default: inherit)")
    parser.add_argument("--trial", help=argparse.SUPPRESS)  # one executor's measurement, in a child
    args = parser.parse_args(argv)
    parts = PARTS if args.parts == "all" else tuple(args.parts.split(","))
    if unknown := set(parts) - set(PARTS):
        parser.error(f"--parts: unknown {sorted(unknown)}; expected some of {PARTS}")
    if not args.trial and not args.corpus:
        parser.error("--corpus CORPUS_DIR is required")
    return args, parts


def main(argv=None):
    args, parts = parse(argv)
    if args.trial:
        print(json.dumps(trial(json.loads(args.trial))))
        return
    args.corpus = str(Path(args.corpus).resolve())
    os.environ["MULTI30K_DIR"] = args.corpus
    load = lambda: subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    from training.core import provenance

    code = provenance.git_commit()
    grain = importlib.util.find_spec("grain") and importlib.metadata.version("grain")
    print(
        f"# bench.input_pipeline, {datetime.date.today()}\n\n{cpu_description()}{f'; grain {grain}' if grain else ''}"
    )
    print(f"\ncode: {code.get('commit', '?')[:12]}{' (tracked files changed)' if code.get('dirty') else ''}\n")
    print(f"command: {' '.join(sys.argv)}\n\nload before: {load()}")
    cache = Path(args.prepared or tempfile.mkdtemp(prefix="headcount_prepared_"))
    if "prepare" in parts:
        print_prepare(run_prepare(args, cache))
    runs = {}
    if "train" in parts:  # the packing plan computed by the run where no earlier run has cached it
        plan = any(cache.glob("*/packing-*.npz"))
        runs[f"prepared, packing plan {'cached' if plan else 'computed by the run'}"] = train_run(args, cache)
    built = {}
    if {"schedule", "batches", "old"} & set(parts):
        built, seconds = schedules(args, cache)
        print_schedules(seconds)
    if "batches" in parts:
        print_batches(built, batch_rows(built, args.steps))
    if "old" in parts:
        print_old(old_batches(args, cache, built))
    if "executors" in parts:
        print_executors(executors(args, cache, tuple(args.executors.split(","))), args.step_ms)
    if "train" in parts and not any("cached" in what for what in runs):
        runs["prepared, packing plan cached"] = train_run(args, cache)
    if {"train", "train_cold"} & set(parts):
        if "train_cold" in parts:
            cold = Path(tempfile.mkdtemp(prefix="headcount_prepared_cold_"))
            try:
                runs["not prepared (the run prepares first)"] = train_run(args, cold)
            finally:
                shutil.rmtree(cold, ignore_errors=True)
        print_train(runs)
    print(f"\nload after: {load()}\nprepared data: {cache}")


if __name__ == "__main__":
    main()
