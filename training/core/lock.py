"""One writer per directory: an OS lock (`flock`, through portalocker) on a lock file, held while the holder works.

The kernel drops the lock when its holder exits, however it exits (killed, out of memory, its container restarted
and its PID given to another process), so whether a directory is held is the kernel's answer, never a guess from
PIDs. The file holds one JSON line, `{"host": ..., "pid": ...}`, written once the lock is taken and read only to
name the holder to a process it keeps out. The holder removes the file on release while still holding the lock
(portalocker's TemporaryFileLock, which also checks that the file it locked is still the one at the path), so no
two processes ever hold one path. A file there that no process locks was left by a holder that died: it is taken.

NFS locks files but not directories (its flock is emulated with fcntl locks, which need the file opened for
writing); nothing here locks a directory. A file system may keep a lock to the host that took it (NFS mounted with
`local_lock=flock` does), so a lock file written on another host, or one this code cannot read, is refused with
the command that removes it, to run after checking no process still works there.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
from pathlib import Path

import portalocker

from training.core import files

_HELD: dict[str, tuple[portalocker.TemporaryFileLock, dict]] = {}  # this process's locks (and lines) by absolute path


class DirectoryInUse(RuntimeError):
    """Another live process holds the directory's lock (or its holder cannot be checked from here)."""


def claim(lock: Path) -> str | None:
    """Take `lock` for this process until `release` (or its exit); return why not (one line, naming the holder and
    what to do) if another process holds it. Two sweeps (or a scheduler's retries, or two train.py) on one directory
    then never write it at once."""
    lock = Path(lock)
    if held_here := _HELD.get(os.path.abspath(lock)):  # said without opening the file (closing it drops an NFS lock)
        return _busy(lock, held_here[1])
    if why := _foreign(lock):
        return why
    holder = portalocker.TemporaryFileLock(lock, timeout=0, fail_when_locked=True)
    try:
        handle = holder.acquire()  # the file emptied only once the lock is taken
    except portalocker.AlreadyLocked:
        return _busy(lock, _read(lock))
    except portalocker.LockException as error:
        raise _unlockable(lock, error) from error
    me = {"host": socket.gethostname(), "pid": os.getpid()}
    try:
        handle.write(json.dumps(me) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    except OSError as error:  # a full disk at start: named, as the lock is the first file a run writes
        holder.release()
        if refusal := files.naming(error, lock):
            raise refusal from error
        raise
    _HELD[os.path.abspath(lock)] = holder, me
    return None


def release(lock: Path) -> None:
    """Unlock and remove `lock` if this process holds it (a lock another process holds is left alone, as is a
    parent's lock in a child it forked)."""
    held_here = _HELD.pop(os.path.abspath(lock), None)
    if held_here is not None and held_here[1]["pid"] == os.getpid():
        held_here[0].release()


def refusal(lock: Path) -> str | None:
    """Why `lock` keeps this process out (one line naming the holder and what to do), or None if no process holds
    it. It takes a shared lock for an instant to find out, so a claim at that very instant is refused."""
    lock = Path(lock)
    if held_here := _HELD.get(os.path.abspath(lock)):
        return _busy(lock, held_here[1])
    if why := _foreign(lock):
        return why
    try:
        with open(lock, "rb") as handle:
            portalocker.lock(handle, portalocker.LockFlags.SHARED | portalocker.LockFlags.NON_BLOCKING)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except portalocker.AlreadyLocked:
        return _busy(lock, _read(lock))
    except portalocker.LockException as error:
        raise _unlockable(lock, error) from error
    return None  # closing the file dropped the shared lock


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


_GARBAGE = object()


def _read(lock: Path):
    """The holder a lock file names (a dict), None if there is no lock, "" if it is empty, _GARBAGE if unreadable."""
    try:
        text = lock.read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, UnicodeDecodeError):
        return _GARBAGE
    if not text:
        return ""
    try:
        owner = json.loads(text)
    except json.JSONDecodeError:  # HOST:PID, as this code wrote it before it wrote JSON
        host, _, pid = text.rpartition(":")
        owner = {"host": host, "pid": int(pid)} if host and pid.isdigit() else None
    if (
        not isinstance(owner, dict)
        or not isinstance(owner.get("host"), str)
        or type(owner.get("pid")) is not int
        or owner["pid"] <= 0
    ):
        return _GARBAGE
    return owner


def _foreign(lock: Path) -> str | None:
    """Why a lock file this host cannot judge keeps it out (see the module's docstring), or None."""
    owner = _read(lock)
    remove = f"rm {shlex.quote(str(lock))}"
    if owner is _GARBAGE:
        return (
            f"{lock} is not a lock this code can read; if no process is working in {lock.parent}, remove it: {remove}"
        )
    if isinstance(owner, dict) and owner["host"] != socket.gethostname():
        return (
            f"{lock.parent} is in use by {owner['host']}:{owner['pid']} (its {lock.name}), a process on another host "
            f"that this one cannot check; if it has stopped, remove the lock: {remove}"
        )
    return None


def _busy(lock: Path, owner) -> str:
    """The refusal for a lock a live process holds, naming it from its JSON line where that is written."""
    if not isinstance(owner, dict):  # taken an instant ago, its line not written yet
        return f"{lock.parent} is in use by a process starting now (its {lock.name}); wait for it, or stop it first"
    return f"{lock.parent} is in use by {owner['host']}:{owner['pid']} (its {lock.name}); wait for it, or stop it first"


def _unlockable(lock: Path, error: portalocker.LockException) -> OSError:
    """A file system that refuses locks (NFS mounted without its lock service) as an OSError naming the lock."""
    cause = error.__cause__ if isinstance(error.__cause__, OSError) else OSError(None, str(error))
    return OSError(cause.errno, f"the file system cannot lock it ({cause.strerror})", str(lock))
