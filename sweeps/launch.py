"""Sweeps on a cluster through submitit: one scheduler job per (point, seed), each the point's own command.

The job runs exactly what `--launcher local` runs in a subprocess (`sweep.point_command`), so a point
resumes, skips and stores its results the same way wherever it runs. A point that spans hosts keeps
using jax.distributed as train.py does (its SLURM environment is detected by training.parallel.distributed).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import submitit

from sweeps import sweep


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
) -> list[tuple[sweep.Point, submitit.Job]]:
    """Submit one job per unfinished (point, seed); job logs go to WORKDIR/submitit/."""
    module = sweep.load_module(config_path)
    todo = sweep.pending(results_dir, config_path, module, seeds)
    ex = executor(Path(workdir) / "submitit", options, cluster)
    cwd = os.getcwd()
    cache_dir = sweep.sweep_cache_dir()  # one compilation cache for every job (on the cluster's shared filesystem)
    commands = [
        submitit.helpers.CommandFunction(
            sweep.point_command(program, config_path, workdir, results_dir, p, cache_dir), cwd=cwd
        )
        for p in todo
    ]
    jobs = ex.submit_array(commands) if commands else []
    for point, job in zip(todo, jobs):
        print(f"[sweep] submitted {point.name}: job {job.job_id}", flush=True)
    return list(zip(todo, jobs))


def wait(submitted: list[tuple[sweep.Point, submitit.Job]]) -> list[sweep.Point]:
    """Wait for every job; return the points whose job failed."""
    failed = []
    for point, job in submitted:
        try:
            job.result()
            print(f"[sweep] done {point.name} (job {job.job_id})", flush=True)
        except Exception as error:
            print(
                f"[sweep] FAILED {point.name} (job {job.job_id}): {str(error).splitlines()[0] if str(error) else type(error).__name__}",
                flush=True,
            )
            failed.append(point)
    return failed
