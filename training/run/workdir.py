"""A run's workdir: where its lock, its prepared-data record and earlier runs go, and the checks made on it first.

A workdir that holds a run is resumed or refused, never started over silently: `check_history` refuses one whose
run cannot be resumed, and a restart moves the run aside (`move_run_aside`) rather than deleting it.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from training.core import files
from training.core.errors import RunRefused

LOCK_FILE = "train.lock"  # held by the process training in the workdir, naming its host and PID (training.core.lock)
PREVIOUS = "previous"  # WORKDIR/previous/TIME/: a run that `restart` moved aside
PREPARED_FILE = "prepared.json"  # the prepared training data a run reads: its directory and manifest's SHA-256


def check_writable(workdir: Path) -> None:
    """ValueError unless `workdir` is a directory this process can write, or can be created (the nearest existing
    ancestor is a writable directory)."""
    existing = next(p for p in (workdir, *workdir.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"--workdir {workdir}: {existing} is a file; expected a directory (or a path to create)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(
            f"--workdir {workdir}: {existing} is not writable by this user; expected a directory train.py can write"
        )


def _steps_in(folder: Path) -> list[int]:
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


def check_history(workdir: Path) -> None:
    """RunRefused if `workdir` holds a run (logged metrics, a best/ or set-aside checkpoint) but no checkpoint to
    resume, or checkpoints but no config.json (nothing to check the requested config against).

    A start that was killed before its first record (config.json, the vocabulary, an empty metrics.jsonl)
    holds no run: the same command starts it again.
    """
    saved = [f"{folder}/ step {s}" for folder in ("checkpoints", "best") for s in _steps_in(workdir / folder)]
    if saved and not (workdir / "config.json").is_file():
        raise RunRefused(
            f"{workdir} holds checkpoints ({', '.join(saved)}) but no config.json, so the run's config cannot be "
            f"checked against this one: put the run's config.json back to resume it, pass --restart to start over "
            f"(the old run is moved to {workdir / PREVIOUS}/), or use a new --workdir"
        )
    metrics = workdir / "metrics.jsonl"
    logged = [r.get("step", 0) for r in files.read_jsonl(metrics)] if metrics.is_file() else []
    aside = (
        [p.name for p in (workdir / "checkpoints").iterdir() if p.is_dir() and not p.name.isdigit()]
        if (workdir / "checkpoints").is_dir()
        else []
    )
    evidence = (
        ([f"metrics.jsonl to step {max(logged)}"] if logged else [])
        + [f"best/ step {s}" for s in _steps_in(workdir / "best")]
        + [f"checkpoints/{name}/" for name in sorted(aside)]
    )
    if evidence and not _steps_in(workdir / "checkpoints"):
        what = (
            f"{workdir / 'checkpoints'} is missing, but {workdir} holds a run"
            if not (workdir / "checkpoints").is_dir()
            else f"{workdir} holds a run"
        )
        refused = FileNotFoundError if not (workdir / "checkpoints").is_dir() else RunRefused
        raise refused(
            f"{what} ({', '.join(evidence)}) but no checkpoint in {workdir / 'checkpoints'} to resume from: "
            f"restore them to resume, pass --restart to start over (the old run is moved to {workdir / PREVIOUS}/), "
            "or use a new --workdir"
        )


def move_run_aside(workdir: Path, keep: tuple[str, ...] = ()) -> None:
    """Move everything in `workdir` but its lock, earlier runs and `keep` to `workdir/previous/TIME/` (nothing is
    deleted)."""
    names = [p for p in workdir.iterdir() if p.name not in (LOCK_FILE, PREVIOUS, *keep)]
    if not names:
        return
    target = workdir / PREVIOUS / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    n = 1
    while target.exists():
        target, n = target.with_name(f"{target.name.split('.')[0]}.{n}"), n + 1
    target.mkdir(parents=True)
    for path in names:
        os.replace(path, target / path.name)
    logging.warning("restart: the run that was in %s is moved to %s", workdir, target)
