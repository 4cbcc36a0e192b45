"""One writer per directory: a lock file holding HOST:PID, taken over when its process has died on this host."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path


class DirectoryInUse(RuntimeError):
    """Another live process holds the directory's lock."""


def claim(lock: Path) -> str | None:
    """Take `lock` (HOST:PID of this process); return the holder's HOST:PID if another live one has it.

    Two sweeps (or a scheduler's retries, or two train.py) on one directory then never write it at once; a lock
    left by a process that died on this host is taken over.
    """
    me = f"{socket.gethostname()}:{os.getpid()}"
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if (owner := holder(lock)) is not None:
                return owner
            lock.unlink(missing_ok=True)  # stale: its process is gone
            continue
        with os.fdopen(fd, "w") as f:
            f.write(me)
        return None
    return lock.read_text().strip()


def holder(lock: Path) -> str | None:
    """HOST:PID of the live process holding `lock`, or None (no lock, or its process has died on this host)."""
    try:
        owner = lock.read_text().strip()
    except FileNotFoundError:
        return None
    host, _, pid = owner.partition(":")
    return owner if host != socket.gethostname() or _alive(int(pid or 0)) else None


@contextlib.contextmanager
def held(lock: Path):
    """Hold `lock` for the `with` body; DirectoryInUse naming the holder if another live process has it."""
    owner = claim(lock)
    if owner is not None:
        raise DirectoryInUse(f"{lock.parent} is in use by {owner} (its {lock.name}); wait for it, or stop it first")
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid > 0
