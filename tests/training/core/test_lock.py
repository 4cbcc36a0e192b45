"""The workdir lock: taken over exactly when its holder is provably gone, refused with the way out otherwise."""

import errno
import json
import multiprocessing
import os
import shlex
import socket
import stat
import subprocess
import sys

import pytest

from training.core import lock


def dead_pid() -> int:
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(finished.stdout)


def test_a_lock_names_host_pid_and_start_and_is_released(tmp_path):
    path = tmp_path / "train.lock"
    assert lock.claim(path) is None
    owner = json.loads(path.read_text())
    assert owner == {"host": socket.gethostname(), "pid": os.getpid(), "started": lock.process_start(os.getpid())}
    assert "in use by" in lock.claim(path)  # held by a live process (this one)
    lock.release(path)
    assert not path.exists()


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
def test_a_lock_whose_holder_is_provably_gone_is_taken_over(tmp_path, content):
    path = tmp_path / "train.lock"
    path.write_text(content.format(host=socket.gethostname(), dead=dead_pid(), me=os.getpid()))
    assert lock.refusal(path) is None
    assert lock.claim(path) is None
    assert json.loads(path.read_text())["pid"] == os.getpid()


def test_a_live_holder_on_this_host_is_refused(tmp_path):
    path = tmp_path / "train.lock"
    other = subprocess.Popen(["sleep", "60"])
    try:
        path.write_text(
            json.dumps({"host": socket.gethostname(), "pid": other.pid, "started": lock.process_start(other.pid)})
        )
        assert (
            lock.claim(path) == f"{tmp_path} is in use by {socket.gethostname()}:{other.pid} (its train.lock); "
            "wait for it, or stop it first"
        )
        path.write_text(
            f"{socket.gethostname()}:{other.pid}"
        )  # an older lock: alive, start unknown, so not provably gone
        assert "in use by" in lock.claim(path)
    finally:
        other.kill()
        other.wait()


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


def test_where_a_directory_cannot_be_flocked_a_guard_file_is(tmp_path, monkeypatch):
    flock = lock.fcntl.flock

    def no_directories(fd, operation):  # as NFS, which emulates flock with fcntl locks (write access needed)
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EBADF, "Bad file descriptor")
        return flock(fd, operation)

    monkeypatch.setattr(lock.fcntl, "flock", no_directories)
    path = tmp_path / "train.lock"
    assert lock.claim(path) is None and "in use by" in lock.claim(path)
    lock.release(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [lock.GUARD_FILE]
