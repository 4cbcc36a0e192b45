"""Launching a sweep's points: each unfinished (point, seed) runs as its own process (`point_command`).

`point_command` is one point's `sweep.py point` command line; `pending` is what a start of the sweep has left
to train (it writes sweep.json and adopts shared points' seeds first: sweeps/adopt.py). Two launchers run those
points, each as the point's own command, so a point resumes, skips and stores its results the same way
wherever it runs:

- the local launcher (`run_sweep`): subprocesses of this machine, `jobs` at a time, or `points_per_device` K
  at a time on each accelerator, each process seeing one device and a 1/K share of its memory (on a CPU,
  K points at a time: `slot_environments`); given neither, one point per GPU on a machine with several, else
  one at a time (`default_slots`); a sweep whose points' mesh would not cover the devices a point process
  sees is refused before any starts (`check_meshes`);
- the SLURM launcher (`submit`, `wait`): one submitit job per point. A point that spans hosts keeps using
  jax.distributed as train.py does (its SLURM environment is detected by training.parallel.distributed).

Every point of a sweep compiles through one persistent compilation cache (`sweep_cache_dir`). Both launchers print
a line as each point starts (local) and ends, the ends with the count so far, and draw a bar where stderr is a
terminal: points finished of the sweep's, done / running / failed, and (local) an ETA from the finished points'
durations (`Tally`); (SLURM) jobs pending (`job_states`).
"""

from __future__ import annotations

import dataclasses
import json
import heapq
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import submitit
import tqdm

from training.core import compile_cache, progress
from training.core.progress import Bar
from training.parallel import sharding
from sweeps import adopt, schema, store
from sweeps.point_run import LOCK_FILE
from sweeps.schema import Point, Stack


def point_command(
    program: list[str],
    config_path: str,
    workdir: Path,
    results_dir: Path,
    point: Point | Stack,
    cache_dir: Path | None = None,
) -> list[str]:
    """`program` (the sweep CLI, e.g. ["python", "sweep.py"]) run on one point (or one stack of a point's seeds),
    its `point` subcommand: what a launcher starts. `cache_dir`: the sweep's one persistent compilation cache
    (`sweep_cache_dir`), for points whose config says 'auto'."""
    cache = ["--compilation_cache_dir", str(cache_dir)] if cache_dir else []
    seeds = (
        ["--stacked_seeds", ",".join(map(str, point.seeds))]
        if isinstance(point, Stack)
        else ["--seed", str(point.seed)]
    )
    return [
        *program,
        "point",
        "--config",
        str(config_path),
        "--workdir",
        str(workdir),
        "--results_dir",
        str(results_dir),
        *cache,
        "--point",
        point.arg,
        *seeds,
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
            "--points_per_device: the local launcher shares GPUs or a CPU between point processes, "
            f"got platform {platform!r}"
        )
    ids = [i.strip() for i in visible.split(",") if i.strip()] if visible else [str(i) for i in range(devices)]
    fraction = f"{0.95 / points_per_device:.3f}"
    return [
        {"CUDA_VISIBLE_DEVICES": device, "XLA_PYTHON_CLIENT_MEM_FRACTION": fraction}
        for _ in range(points_per_device)
        for device in ids[:devices]
    ]


def default_slots(platform: str, devices: int, visible: str | None = None) -> list[dict[str, str]]:
    """The slots of a sweep given neither --jobs nor --points_per_device: one point per GPU where this machine
    has several (`slot_environments` with K = 1), since a point process that saw them all would refuse its
    one-device mesh (config.mesh 1 x 1, `training.parallel.sharding.mesh_shape`); otherwise one point at a time."""
    if platform == "gpu" and devices > 1:
        return slot_environments(platform, devices, 1, visible)
    return [{}]


def check_meshes(module: ModuleType, todo: list[Point], platform: str, seen: int) -> None:
    """A ValueError, before any point starts, naming the first point of `todo` whose config.mesh does not cover
    the `seen` devices each point process sees: the check its trainer makes (`sharding.mesh_shape`), which
    would otherwise fail every point after it has loaded its data."""
    first: dict[int | str, Point] = {}
    for point in todo:  # the seeds of one value share its config
        first.setdefault(point.value, point)
    for point in first.values():
        config = module.get_config(point.arg)
        if config.parallelism != "jit":  # pmap: data parallel over whatever devices there are
            continue
        try:
            sharding.mesh_shape(config.mesh.data, config.mesh.model, seen)
        except ValueError as refused:
            hint = (
                "; the local launcher does not split TPU chips between point processes (docs/sweeps.md)"
                if platform == "tpu"
                else ""
            )
            raise ValueError(
                f"point {point.arg}: each point process here sees {seen} {platform} device(s): {refused}{hint}"
            ) from None


def check_stacks(module: ModuleType, todo: list[Stack], workdir: Path) -> None:
    """A ValueError, before any stack starts, if a point's config cannot train stacked (length buckets: no one batch
    shape) or if WORKDIR holds an unfinished stacked job of the same point over other seeds (another --stack_seeds:
    resuming it needs its own grouping)."""
    for stack in {s.arg: s for s in todo}.values():
        config = module.get_config(stack.arg)
        if not config.data.pack_length:
            raise ValueError(
                f"--stack_seeds: point {stack.arg} trains on length buckets (config.data.pack_length = 0); stacked "
                "seeds need one batch shape a step: expected a packed config (a Table 3 sweep's :packed variant)"
            )
    wanted = {s.name: s for s in todo}
    for stack in todo:
        label = stack.name.rsplit("_seeds", 1)[0]
        for held in sorted(Path(workdir).glob(f"{label}_seeds*/stack.json")):
            name = held.parent.name
            seeds = json.loads(held.read_text())["seeds"]
            if name not in wanted and set(seeds) & set(stack.seeds):
                raise ValueError(
                    f"--stack_seeds {len(stack.seeds)}: {held.parent} holds an unfinished stacked job of point "
                    f"{stack.arg}, seeds {seeds} (--stack_seeds {len(seeds)}); resume it with --stack_seeds "
                    f"{len(seeds)}, or move it aside"
                )


def jobs_of(todo: list[Point], stack_seeds: int | None) -> list[Point | Stack]:
    """What the launchers start for `todo`: a process a point, or (`stack_seeds` S) a process a point's S seeds."""
    return todo if stack_seeds is None else schema.stacks(todo, stack_seeds)


def is_finished(out: Path, job: Point | Stack) -> bool:
    return all(store.is_finished(out, p) for p in (job.points if isinstance(job, Stack) else (job,)))


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


def unfinished(module: ModuleType, seeds: int, results_dir: Path) -> list[Point]:
    return [p for p in schema.points(module, seeds) if not store.is_finished(schema.sweep_dir(results_dir, module), p)]


def pending(results_dir: Path, config_path: str, module: ModuleType, seeds: int) -> list[Point]:
    """What a start of the sweep has left to train: writes sweep.json, adopts shared points' seeds."""
    schema.write_spec(results_dir, config_path, module, seeds)
    adopt.adopt_shared(module, schema.points(module, seeds), results_dir)
    return unfinished(module, seeds, results_dir)


def run_sweep(
    program: list[str],
    config_path: str,
    workdir: Path,
    results_dir: Path,
    seeds: int,
    jobs: int | None = None,
    points_per_device: int | None = None,
    stack_seeds: int | None = None,
) -> list[Point | Stack]:
    """Run every unfinished point as its own process on this machine (`jobs` at a time, or `points_per_device`
    on each accelerator: `slot_environments`; neither given: `default_slots`); return the points that failed.

    Each process is the point's `point_command`, so an interrupted sweep resumes each point from its
    latest checkpoint and skips finished ones; its log goes to WORKDIR/KEYVALUE_seedK.log. Every point
    compiles through one persistent cache (`sweep_cache_dir`). `stack_seeds` S: each process trains S seeds of a
    point as one program (`point_run.run_stack`) over every device it sees (one at a time unless `jobs`).
    """
    if stack_seeds is not None and points_per_device is not None:
        raise ValueError(
            f"--stack_seeds {stack_seeds} and --points_per_device {points_per_device}: a stack of seeds lays them "
            "over every device it sees; give --stack_seeds alone (or --jobs)"
        )
    if jobs is not None and (not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1):
        raise ValueError(f"--jobs must be a positive int, got {jobs!r}")
    if jobs is not None and points_per_device is not None:
        raise ValueError(
            f"--jobs {jobs} and --points_per_device {points_per_device}: give one (points_per_device sets how many run)"
        )
    platform, devices = local_devices()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if jobs is not None:
        slots = [{} for _ in range(jobs)]
    elif points_per_device is not None:
        slots = slot_environments(platform, devices, points_per_device, visible)
    else:
        slots = default_slots(platform, devices, visible)
    module = schema.load_module(config_path)
    todo = jobs_of(pending(results_dir, config_path, module, seeds), stack_seeds)
    if stack_seeds is None:
        check_meshes(module, todo, platform, 1 if "CUDA_VISIBLE_DEVICES" in slots[0] else devices)
    else:
        slots = slots if jobs is not None else [{}]  # a stack sees every device (training.parallel.stacked.layout)
        check_stacks(module, todo, workdir)
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
            schema.sweep_dir(results_dir, module),
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


BAR_FORMAT = "{desc}: {n_fmt}/{total_fmt} {unit}s finished |{bar}| {elapsed}{postfix}"  # the ETA is Tally's


def _drive(program, config_path, workdir, results_dir, out, slots, todo, running, failed):
    cache_dir = sweep_cache_dir()
    tally = Tally(len(todo), len(slots))
    with Bar(total=len(todo), desc="[sweep]", unit="point", bar_format=BAR_FORMAT) as bar:
        while todo or running:
            while todo and len(running) < len(slots):
                point = todo.pop(0)
                slot = min(set(range(len(slots))) - {entry[3] for entry in running})
                log = open(workdir / f"{point.name}.log", "a")
                command = point_command(program, config_path, workdir, results_dir, point, cache_dir)
                shown = " ".join(f"{k}={v}" for k, v in slots[slot].items())
                tally.start(point.name)
                progress.write(
                    f"[sweep] start {point.name} ({tally.started} of {tally.total}): "
                    f"{shown + ' ' if shown else ''}{shell_line(command)}"
                )
                env = {**os.environ, **slots[slot]}
                process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
                running.append((point, process, log, slot))
            time.sleep(1.0)
            for entry in [e for e in running if e[1].poll() is not None]:
                running.remove(entry)
                entry[2].close()
                outcome = _outcome(entry[0], entry[1].returncode, out, failed)
                tally.finish(entry[0].name, outcome)
                progress.write(f"{_outcome_line(entry[0], entry[1].returncode, outcome, workdir)} [{tally.summary()}]")
                bar.update()
            bar.set_postfix_str(tally.postfix())  # every second: the ETA and elapsed time move on


def _outcome(point: Point | Stack, returncode: int, out: Path, failed: list) -> str:
    """'done', 'FAILED' (the point joins `failed`) or 'left' (exit 0 but not stored: another process holds it)."""
    if returncode == 0:
        return "done" if is_finished(out, point) else "left"
    failed.append(point)
    return "FAILED"


def _outcome_line(point: Point, returncode: int, outcome: str, workdir: Path) -> str:
    if outcome == "left":
        return f"[sweep] left {point.name} to the process holding {workdir / point.name / LOCK_FILE}"
    return f"[sweep] {outcome} {point.name} (exit {returncode})"


class Tally:
    """The local launcher's count of a sweep's points (done, failed, left to another process, running) and its ETA.

    The ETA comes from the durations of the points done so far: each queued point takes their mean, each running
    one the rest of it, and they are spread over the `slots` as the launcher spreads them (the next point on the
    first slot free). None until a point is done. `clock`: seconds (time.monotonic; a test's fake clock).
    """

    def __init__(self, total: int, slots: int, clock=time.monotonic):
        self.total, self.slots, self.clock = total, slots, clock
        self.running: dict[str, float] = {}  # point name -> when it started
        self.durations: list[float] = []  # of the points done
        self.counts = {"done": 0, "FAILED": 0, "left": 0}
        self.started = 0

    def start(self, name: str) -> None:
        self.running[name] = self.clock()
        self.started += 1

    def finish(self, name: str, outcome: str) -> None:
        """`outcome`: 'done', 'FAILED' or 'left' (`_outcome`)."""
        began = self.running.pop(name)
        self.counts[outcome] += 1
        if outcome == "done":
            self.durations.append(self.clock() - began)

    @property
    def finished(self) -> int:
        return sum(self.counts.values())

    def eta_s(self) -> float | None:
        if not self.durations:
            return None
        mean, now = sum(self.durations) / len(self.durations), self.clock()
        free = [max(mean - (now - began), 0.0) for began in self.running.values()]
        free += [0.0] * max(self.slots - len(free), 0)
        heapq.heapify(free)
        for _ in range(self.total - self.finished - len(self.running)):
            heapq.heapreplace(free, free[0] + mean)
        return max(free)

    def postfix(self) -> str:
        """'done 3, running 2, failed 1, eta 0:12:05' (and 'left N' once a point was left to another process)."""
        left = f", left {self.counts['left']}" if self.counts["left"] else ""
        eta = self.eta_s()
        return (
            f"done {self.counts['done']}, running {len(self.running)}, failed {self.counts['FAILED']}{left}, "
            f"eta {'?' if eta is None else tqdm.tqdm.format_interval(eta)}"
        )

    def summary(self) -> str:
        """'3 of 12 finished: done 2, running 2, failed 1, eta 0:12:05': what a done line adds (a log keeps it)."""
        return f"{self.finished} of {self.total} finished: {self.postfix()}"


@dataclasses.dataclass(frozen=True)
class SlurmOptions:
    partition: str = ""  # '': the cluster's default partition
    gpus: int = 0  # GPUs per job
    time_min: int = 240  # the job's time limit in minutes
    cpus: int = 4  # CPU cores per job

    def __post_init__(self):
        for name in ("gpus", "time_min", "cpus"):
            value = getattr(self, name)
            least = 0 if name == "gpus" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"--slurm_{name} must be an int >= {least}, got {value!r}")
        if not isinstance(self.partition, str) or any(c.isspace() for c in self.partition):
            raise ValueError(f"--slurm_partition must be a partition name without spaces, got {self.partition!r}")


def executor(folder: Path, options: SlurmOptions, cluster: str = "slurm") -> submitit.AutoExecutor:
    """A submitit executor for `cluster` ('slurm'; 'local' runs the jobs as local processes, for tests)."""
    if cluster not in ("slurm", "local"):
        raise ValueError(f"cluster must be 'slurm' or 'local', got {cluster!r}")
    ex = submitit.AutoExecutor(folder=folder, cluster=cluster)
    parameters = {
        "timeout_min": options.time_min,
        "gpus_per_node": options.gpus,
        "cpus_per_task": options.cpus,
        "tasks_per_node": 1,
        "nodes": 1,
        "name": "headcount-sweep",
    }
    if options.partition:
        parameters["slurm_partition"] = options.partition
    ex.update_parameters(**parameters)
    return ex


def submit(
    program: list[str],
    config_path: str,
    workdir: Path,
    results_dir: Path,
    seeds: int,
    options: SlurmOptions,
    cluster: str = "slurm",
    stack_seeds: int | None = None,
) -> list[tuple[Point | Stack, submitit.Job]]:
    """Submit one job per unfinished (point, seed), or per stack of a point's seeds (`stack_seeds`); job logs go to
    WORKDIR/submitit/."""
    module = schema.load_module(config_path)
    todo = jobs_of(pending(results_dir, config_path, module, seeds), stack_seeds)
    if stack_seeds is not None:
        check_stacks(module, todo, workdir)
    ex = executor(Path(workdir) / "submitit", options, cluster)
    cwd = os.getcwd()
    cache_dir = sweep_cache_dir()  # one compilation cache for every job (on the cluster's shared filesystem)
    commands = [
        submitit.helpers.CommandFunction(
            point_command(program, config_path, workdir, results_dir, p, cache_dir), cwd=cwd
        )
        for p in todo
    ]
    jobs = ex.submit_array(commands) if commands else []
    for point, job in zip(todo, jobs):
        print(f"[sweep] submitted {point.name}: job {job.job_id}", flush=True)
    return list(zip(todo, jobs))


JOB_POLL_S = 10.0  # between two looks at the jobs' states (submitit asks SLURM at most once a minute)
PENDING_STATES = ("PENDING", "REQUEUED", "CONFIGURING", "UNKNOWN", "READY")  # not started yet, as far as SLURM says


def wait(submitted: list[tuple[Point, submitit.Job]], poll_s: float = JOB_POLL_S) -> list[Point]:
    """Wait for every job, a line for each as it ends and a bar of the jobs' states (done / running / failed /
    pending); return the points whose job failed, in the order they were submitted."""
    failed: list[Point] = []
    left = list(submitted)
    with Bar(total=len(submitted), desc="[sweep] jobs", unit="point", bar_format=BAR_FORMAT) as bar:
        while left:
            for point, job in [entry for entry in left if entry[1].done()]:
                left.remove((point, job))
                line = _job_result(point, job, failed)
                bar.update()
                progress.write(f"{line} [{len(submitted) - len(left)} of {len(submitted)} finished]")
            bar.set_postfix_str(job_states(left, len(submitted) - len(left) - len(failed), len(failed)))
            if left:
                time.sleep(poll_s)
    order = {point.name: i for i, (point, _) in enumerate(submitted)}
    return sorted(failed, key=lambda point: order[point.name])


def _job_result(point: Point, job: submitit.Job, failed: list[Point]) -> str:
    """A finished job's line, done or FAILED (the point joins `failed`)."""
    try:
        job.result()
        return f"[sweep] done {point.name} (job {job.job_id})"
    except Exception as error:
        why = str(error).splitlines()[0] if str(error) else type(error).__name__
        failed.append(point)
        return f"[sweep] FAILED {point.name} (job {job.job_id}): {why}"


def job_states(waiting: list[tuple[Point, submitit.Job]], done: int, failed: int) -> str:
    """'done 3, running 2, failed 1, pending 4': the bar's count of the jobs, those still `waiting` by their state."""
    states = [str(job.state).upper() for _, job in waiting]
    pending = sum(state in PENDING_STATES for state in states)
    return f"done {done}, running {len(states) - pending}, failed {failed}, pending {pending}"
