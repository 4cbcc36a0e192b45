"""write_atomic: unique temporary names in the target's directory, safe for many writers at once; a full disk or
read-only directory named in the error (atomic writes, metrics, checkpoints)."""

import errno
import multiprocessing
import os
import stat

import jax.numpy as jnp
import pytest

from training import checkpoints
from training.core import errors as user_errors, files, lock
from training.core.metrics import MetricsWriter


def _write_many(path, marker, barrier, errors):
    barrier.wait()
    try:
        for _ in range(20):
            files.write_atomic(path, marker * 100_000)
    except Exception as error:
        errors.put(f"{type(error).__name__}: {error}")


@pytest.mark.filterwarnings(
    "ignore::RuntimeWarning", "ignore::DeprecationWarning"
)  # os.fork with JAX imported: the writers use no JAX
def test_many_processes_writing_one_target_all_succeed_and_leave_one_whole_version(tmp_path):
    writers = 12
    path = tmp_path / "spm.model"
    context = multiprocessing.get_context("fork")
    barrier, errors = context.Barrier(writers), context.Queue()
    processes = [
        context.Process(target=_write_many, args=(path, bytes([65 + i]), barrier, errors)) for i in range(writers)
    ]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout=120)
    assert errors.empty(), errors.get()
    content = path.read_bytes()
    assert len(content) == 100_000 and len(set(content)) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spm.model"]  # no temporary file left


def test_a_symlink_at_a_fixed_temporary_name_is_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (tmp_path / ".config.json.tmp").symlink_to(victim)
    files.write_atomic(tmp_path / "config.json", "new")
    assert victim.read_text() == "keep" and (tmp_path / "config.json").read_text() == "new"


def test_the_written_file_has_the_usual_permissions(tmp_path):
    umask = os.umask(0o022)
    try:
        files.write_atomic(tmp_path / "a.json", "{}")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644


def test_a_failed_write_leaves_the_old_content_and_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "a.json"
    path.write_text("old")
    monkeypatch.setattr(files.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with pytest.raises(OSError):
        files.write_atomic(path, "new")
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def _full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")  # as a write() raises it: no file named


def _read_only(*args, **kwargs):
    raise OSError(errno.EROFS, "Read-only file system")


def test_a_full_disk_during_an_atomic_write_names_the_target(tmp_path, monkeypatch):
    monkeypatch.setattr(files.os, "fsync", _full_disk)
    with pytest.raises(OSError) as raised:
        files.write_atomic(tmp_path / "config.json", "{}")
    assert raised.value.errno == errno.ENOSPC and user_errors.one_line(raised.value).startswith(
        f"{tmp_path / 'config.json'}: No space"
    )
    assert list(tmp_path.iterdir()) == []  # its temporary file removed


def test_a_read_only_directory_at_start_names_the_target(tmp_path, monkeypatch):
    monkeypatch.setattr(files.tempfile, "mkstemp", _read_only)  # chmod does not stop root
    with pytest.raises(OSError) as raised:
        files.write_atomic(tmp_path / "spm.model", b"x")
    assert user_errors.one_line(raised.value) == f"{tmp_path / 'spm.model'}: Read-only file system (writing it)"


def test_a_full_disk_writing_metrics_names_the_file(tmp_path, monkeypatch):
    writer = MetricsWriter(tmp_path)
    monkeypatch.setattr(
        writer,
        "jsonl",
        type("Full", (), {"name": writer.jsonl.name, "write": _full_disk, "close": lambda self: None})(),
    )
    with pytest.raises(OSError) as raised:
        writer.write({"step": 1, "loss": 2.0})
    writer.tensorboard.close()
    assert user_errors.one_line(raised.value).startswith(f"{tmp_path / 'metrics.jsonl'}: No space left on device")


def test_a_full_disk_during_a_checkpoint_save_names_the_step_folder(tmp_path, monkeypatch):
    ckpts = checkpoints.Checkpoints(tmp_path, keep=2)

    def wrapped(*args, **kwargs):  # orbax reports a failed write inside an error of its own
        try:
            _full_disk()
        except OSError as error:
            raise ValueError("async save failed") from error

    monkeypatch.setattr(ckpts.latest, "save", wrapped)
    monkeypatch.setattr(ckpts.best, "save", wrapped)
    state = {"w": jnp.ones(3)}
    with pytest.raises(OSError) as raised:
        ckpts.save(5, state)
    assert user_errors.one_line(raised.value).startswith(f"{tmp_path / 'checkpoints' / '5'}: No space left on device")
    with pytest.raises(OSError) as raised:
        ckpts.save_if_best(5, state, 1.0)
    assert user_errors.one_line(raised.value).startswith(f"{tmp_path / 'best' / '5'}: No space left on device")


def test_an_error_that_is_not_the_file_system_passes_unchanged(tmp_path, monkeypatch):
    monkeypatch.setattr(files.os, "fsync", lambda fd: (_ for _ in ()).throw(ValueError("mine")))
    with pytest.raises(ValueError, match="mine"):
        files.write_atomic(tmp_path / "x", "y")


def test_a_full_disk_taking_the_lock_at_start_names_the_lock(tmp_path, monkeypatch):
    monkeypatch.setattr(lock.os, "fsync", _full_disk)
    with pytest.raises(OSError) as raised:
        lock.claim(tmp_path / "train.lock")
    assert user_errors.one_line(raised.value) == f"{tmp_path / 'train.lock'}: No space left on device (writing it)"


def test_orbax_reporting_a_full_disk_in_its_own_words_is_named_and_not_logged(tmp_path, monkeypatch, caplog):
    """tensorstore's refusal reaches the save as a ValueError with the errno in its text; orbax logs it from its
    threads."""
    ckpts = checkpoints.Checkpoints(tmp_path, keep=2)
    message = "RESOURCE_EXHAUSTED: Error writing local file 'x': No space left on device [os_error_code='28']"

    def refused(*args, **kwargs):
        checkpoints.logging.getLogger("absl").handle(
            checkpoints.logging.LogRecord(
                "absl", checkpoints.logging.ERROR, "/site-packages/orbax/checkpoint/future.py", 1, message, (), None
            )
        )
        raise ValueError(message)

    monkeypatch.setattr(ckpts.latest, "save", refused)
    with caplog.at_level("INFO"), pytest.raises(OSError) as raised:
        ckpts.save(5, {"w": jnp.ones(3)})
    assert (
        user_errors.one_line(raised.value) == f"{tmp_path / 'checkpoints' / '5'}: No space left on device (writing it)"
    )
    assert "RESOURCE_EXHAUSTED" not in caplog.text
