"""The workdir lock: an OS lock its holder keeps while alive; refused naming the holder, taken once it is gone."""

import contextlib
import errno
import fcntl
import json
import multiprocessing
import os
import shlex
import socket
import stat
import subprocess
import sys
from pathlib import Path

import portalocker
import pytest

from training.core import errors as user_errors, lock


def dead_pid() -> int:
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(finished.stdout)


REPO = Path(__file__).resolve().parents[3]
HOLD = "import sys; from training.core import lock; print(lock.claim(sys.argv[1]), flush=True); sys.stdin.read()"


@contextlib.contextmanager
def holding(path):
    """A live process on this host holding the lock `path` until it is killed (so it never releases it)."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout.readline() == "None\n"
        yield process
    finally:
        process.kill()
        process.wait()


def test_a_lock_names_host_and_pid_and_is_released(tmp_path):
    path = tmp_path / "train.lock"
    assert lock.claim(path) is None
    owner = json.loads(path.read_text())
    assert owner == {"host": socket.gethostname(), "pid": os.getpid()}
    assert "in use by" in lock.claim(path) and "in use by" in lock.refusal(path)  # held by a live process (this one)
    lock.release(path)
    assert not path.exists() and lock.refusal(path) is None


@pytest.mark.parametrize(
    "content",
    [
        "",  # a start that died between creating the file and writing it
        "{host}:{dead}",  # HOST:PID of a process that has exited
        '{{"host": "{host}", "pid": {dead}, "started": null}}',
        # PID reused (a restarted container: PID 1 again)
        '{{"host": "{host}", "pid": {me}, "started": "another-boot/1"}}',
        "{host}:{me}",  # an older lock naming this PID: another process wrote it
    ],
)
def test_a_lock_no_live_process_holds_is_taken_over(tmp_path, content):
    path = tmp_path / "train.lock"
    path.write_text(content.format(host=socket.gethostname(), dead=dead_pid(), me=os.getpid()))
    assert lock.refusal(path) is None
    assert lock.claim(path) is None
    assert json.loads(path.read_text())["pid"] == os.getpid()
    lock.release(path)


def test_a_live_holder_on_this_host_is_refused_naming_it_and_its_lock_is_free_once_it_is_killed(tmp_path):
    path = tmp_path / "train.lock"
    with holding(path) as other:
        name = f"{socket.gethostname()}:{other.pid}"
        said = f"{tmp_path} is in use by {name} (its train.lock); wait for it, or stop it first"
        assert lock.claim(path) == said and lock.refusal(path) == said
        with pytest.raises(lock.DirectoryInUse, match=f"in use by {name}"):
            with lock.held(path):
                pass
        assert json.loads(path.read_text())["pid"] == other.pid  # the holder's line left as it was
        other.kill()  # no release: its lock file stays, the kernel drops its lock
        other.wait()
        assert path.exists() and lock.refusal(path) is None
        assert lock.claim(path) is None and json.loads(path.read_text())["pid"] == os.getpid()
    lock.release(path)


@pytest.mark.parametrize(
    "content, says",
    [
        (
            '{"host": "elsewhere", "pid": 12, "started": "b/3"}',
            "in use by elsewhere:12 (its train.lock), a process on another host",
        ),
        ("elsewhere:12", "in use by elsewhere:12"),
        ("HOST:abc", "is not a lock this code can read"),
        ("\xff\xfe", "is not a lock this code can read"),
        ("[1, 2]", "is not a lock this code can read"),
    ],
)
def test_a_lock_from_another_host_or_unreadable_is_refused_with_the_command_that_removes_it(tmp_path, content, says):
    workdir = tmp_path / "my run"
    workdir.mkdir()
    path = workdir / "train.lock"
    path.write_bytes(content.encode("latin-1"))
    why = lock.claim(path)
    assert says in why and why.endswith(f"rm {shlex.quote(str(path))}") and "\n" not in why
    with pytest.raises(lock.DirectoryInUse, match="rm "):
        with lock.held(path):
            pass
    assert path.read_bytes() == content.encode("latin-1")  # left as it was


def test_release_leaves_a_lock_another_process_holds(tmp_path):
    path = tmp_path / "train.lock"
    path.write_text('{"host": "elsewhere", "pid": 12, "started": null}')
    lock.release(path)
    assert path.exists()


def _claimer(directories, barrier, results):
    for directory in directories:
        barrier.wait()
        won = lock.claim(os.path.join(directory, "train.lock")) is None
        results.put((directory, os.getpid(), won))
        barrier.wait()  # the winner stays alive until every claimer has tried


@pytest.mark.filterwarnings(
    "ignore::RuntimeWarning", "ignore::DeprecationWarning"
)  # os.fork with JAX imported: the claimers use no JAX
@pytest.mark.parametrize("stale", ["", "{host}:{dead}", '{{"host": "{host}", "pid": {me}, "started": "x/1"}}', None])
def test_many_concurrent_claimers_of_one_lock_exactly_one_wins(tmp_path, stale):
    trials, claimers = 12, 16
    directories = []
    for trial in range(trials):
        directory = tmp_path / str(trial)
        directory.mkdir()
        if stale is not None:
            (directory / "train.lock").write_text(
                stale.format(host=socket.gethostname(), dead=dead_pid(), me=os.getpid())
            )
        directories.append(str(directory))
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(claimers), context.Queue()
    processes = [context.Process(target=_claimer, args=(directories, barrier, results)) for _ in range(claimers)]
    for p in processes:
        p.start()
    outcomes = [results.get(timeout=120) for _ in range(trials * claimers)]
    for p in processes:
        p.join(timeout=60)
    for directory in directories:
        winners = [pid for d, pid, won in outcomes if d == directory and won]
        assert len(winners) == 1, (directory, winners)
        assert json.loads((tmp_path / directory / "train.lock").read_text())["pid"] == winners[0]


def _hold(path, held, done):
    assert lock.claim(path) is None
    held.set()
    done.wait(60)
    lock.release(path)


@pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::DeprecationWarning")  # os.fork with JAX imported
def test_where_a_directory_cannot_be_flocked_the_lock_file_is(tmp_path, monkeypatch):
    def as_nfs(fd, operation):  # NFS emulates flock with fcntl locks: no directories, write access for an exclusive one
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EBADF, "Bad file descriptor")
        if operation & fcntl.LOCK_EX and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
            raise OSError(errno.EBADF, "Bad file descriptor")
        return fcntl.flock(fd, operation)

    monkeypatch.setattr(portalocker.portalocker, "LOCKER", as_nfs)
    path = tmp_path / "train.lock"
    context = multiprocessing.get_context("fork")
    held, done = context.Event(), context.Event()
    other = context.Process(target=_hold, args=(path, held, done))
    other.start()
    try:
        assert held.wait(60)
        said = f"{tmp_path} is in use by {socket.gethostname()}:{other.pid} (its train.lock)"
        assert lock.claim(path).startswith(said) and lock.refusal(path).startswith(said)
    finally:
        done.set()
        other.join(60)
    assert other.exitcode == 0 and list(tmp_path.iterdir()) == [] and lock.refusal(path) is None
    assert lock.claim(path) is None and lock.refusal(path).startswith(f"{tmp_path} is in use by")
    lock.release(path)
    assert list(tmp_path.iterdir()) == []


def test_a_file_system_that_refuses_locks_is_one_error_naming_the_lock(tmp_path, monkeypatch):
    def no_lock_service(fd, operation):  # NFS mounted without its lock service
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(portalocker.portalocker, "LOCKER", no_lock_service)
    path = tmp_path / "train.lock"
    for attempt in (lock.claim, lock.refusal):
        path.write_text("")
        with pytest.raises(OSError) as raised:
            attempt(path)
        assert user_errors.one_line(raised.value) == f"{path}: the file system cannot lock it (No locks available)"
