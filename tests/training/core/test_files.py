"""write_atomic: unique temporary names in the target's directory, safe for many writers at once."""

import multiprocessing
import os
import stat

import pytest

from training.core import files


def _write_many(path, marker, barrier, errors):
    barrier.wait()
    try:
        for _ in range(20):
            files.write_atomic(path, marker * 100_000)
    except Exception as error:  # noqa: BLE001 - reported to the parent
        errors.put(f"{type(error).__name__}: {error}")


@pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::DeprecationWarning")  # os.fork with JAX imported: the writers use no JAX
def test_many_processes_writing_one_target_all_succeed_and_leave_one_whole_version(tmp_path):
    writers = 12
    path = tmp_path / "spm.model"
    context = multiprocessing.get_context("fork")
    barrier, errors = context.Barrier(writers), context.Queue()
    processes = [context.Process(target=_write_many, args=(path, bytes([65 + i]), barrier, errors)) for i in range(writers)]
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
