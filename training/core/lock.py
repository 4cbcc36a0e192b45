"""One writer per directory: a lock file naming its holder (host, PID, the process's start), taken over when that
process is provably gone.

The lock file is one JSON line, `{"host": ..., "pid": ..., "started": ...}`, where `started` is the kernel's boot id
and the process's start time (field 22 of /proc/PID/stat): a PID that a later process (or a restarted container)
reuses is then told apart from the holder. The file is written whole before it appears (a temporary file in the
same directory, then a link or rename), so a lock is never empty; an empty one is the remains of a start that died
and is taken over. Claims and releases are serialised by `fcntl.flock` on the lock's directory, so two processes
taking over one stale lock cannot both win.

A lock is taken over only when its holder is provably gone: written on this host, and its PID is dead or belongs
to a process that started at another time. A lock from another host, or one this code cannot read, is refused
with the command that removes it (after checking no process still trains there).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import socket
import tempfile
from pathlib import Path

from training.core import files


class DirectoryInUse(RuntimeError):
    """Another live process holds the directory's lock (or its holder cannot be checked from here)."""


def claim(lock: Path) -> str | None:
    """Take `lock` for this process; return why not (one line, naming the holder and what to do) if it is held.

    Two sweeps (or a scheduler's retries, or two train.py) on one directory then never write it at once; a lock
    whose holder is provably gone (see the module's docstring) is taken over.
    """
    lock = Path(lock)
    with _guard(lock.parent):
        refused, stale = _judge(lock)
        if refused is not None:
            return refused
        try:
            _write(lock, json.dumps(_me()), replace=stale)
        except FileExistsError:  # made just now by a process that does not take the guard (an older version)
            return f"{lock.parent} is in use (its {lock.name} appeared while this process claimed it); wait for it"
    return None


def release(lock: Path) -> None:
    """Remove `lock` if this process holds it (a lock another process has taken since is left alone)."""
    lock = Path(lock)
    with _guard(lock.parent):
        if _read(lock) == _me():
            lock.unlink(missing_ok=True)


def refusal(lock: Path) -> str | None:
    """Why `lock` keeps this process out (one line naming the holder and what to do), or None (free or stale)."""
    lock = Path(lock)
    if not lock.parent.is_dir():
        return None
    with _guard(lock.parent):
        return _judge(lock)[0]


@contextlib.contextmanager
def held(lock: Path):
    """Hold `lock` for the `with` body; DirectoryInUse saying who has it and what to do if it cannot be taken."""
    why = claim(lock)
    if why is not None:
        raise DirectoryInUse(why)
    try:
        yield
    finally:
        release(lock)


def process_start(pid: int) -> str | None:
    """The boot id and start time (clock ticks since boot) of process `pid`, or None (no such process, or no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the name (field 2) may hold spaces and parentheses
    return f"{boot}/{fields[19]}"  # field 22; fields[0] is field 3


def _me() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": process_start(os.getpid())}


_GARBAGE = object()


def _read(lock: Path):
    """The holder a lock file names (a dict), None if there is no lock, "" if it is empty, _GARBAGE if unreadable."""
    try:
        text = lock.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError):
        return _GARBAGE
    if not text:
        return ""
    try:
        owner = json.loads(text)
    except json.JSONDecodeError:  # HOST:PID, as this code wrote it before it recorded start times
        host, _, pid = text.rpartition(":")
        owner = {"host": host, "pid": int(pid), "started": None} if host and pid.isdigit() else None
    if (
        not isinstance(owner, dict)
        or not isinstance(owner.get("host"), str)
        or type(owner.get("pid")) is not int
        or owner["pid"] <= 0
        or not isinstance(owner.get("started"), (str, type(None)))
    ):
        return _GARBAGE
    return owner


def _judge(lock: Path) -> tuple[str | None, bool]:
    """(why `lock` is refused or None, whether a lock file is there to take over). Call under `_guard`."""
    owner = _read(lock)
    if owner is None:
        return None, False
    if owner == "":  # a lock is written whole before it appears: an empty one is a start that died
        return None, True
    remove = f"rm {shlex.quote(str(lock))}"
    if owner is _GARBAGE:
        return (
            f"{lock} is not a lock this code can read; if no process is working in {lock.parent}, remove it: {remove}"
        ), False
    name = f"{owner['host']}:{owner['pid']}"
    if owner["host"] != socket.gethostname():
        return (
            f"{lock.parent} is in use by {name} (its {lock.name}), a process on another host that this one cannot "
            f"check; if it has stopped, remove the lock: {remove}"
        ), False
    started = process_start(owner["pid"])
    if owner["pid"] == os.getpid() and owner["started"] is None:  # an older lock naming this PID: not ours, so stale
        return None, True
    alive = _alive(owner["pid"])
    reused = alive and owner["started"] is not None and started is not None and started != owner["started"]
    if not alive or reused:
        return None, True
    return f"{lock.parent} is in use by {name} (its {lock.name}); wait for it, or stop it first", False


def _write(lock: Path, text: str, replace: bool) -> None:
    """Put `text` at `lock` whole: a temporary file, then a link (fails if one appeared) or, taking over, a rename."""
    fd, tmp = tempfile.mkstemp(dir=lock.parent, prefix=f".{lock.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text + "\n")
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, lock)
        else:
            os.link(tmp, lock)  # exclusive: FileExistsError if another process (outside the guard) made one
    except OSError as error:  # a full disk at start: named, as the lock is the first file a run writes
        if refusal := files.naming(error, lock):
            raise refusal from error
        raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


GUARD_FILE = (
    ".lock-guard"  # flocked instead of the directory where a directory cannot be (NFS emulates flock with fcntl locks)
)


@contextlib.contextmanager
def _guard(directory: Path):
    """An exclusive flock on `directory` for the body: claims and releases of its locks happen one at a time.

    Where the file system refuses a lock on a directory, the lock is on `directory/GUARD_FILE` instead (created
    once, never removed: removing it would let two claimers lock two different files).
    """
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            os.close(fd)
            fd = os.open(directory / GUARD_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid > 0
