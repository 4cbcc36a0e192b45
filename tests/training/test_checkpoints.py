"""Checkpoints are verified on restore: bytes corrupted on disk (size unchanged) are caught, not trained on."""

import asyncio
import errno
import json
import logging
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from training import checkpoints
from training.core import errors as user_errors


ROOT = Path(__file__).resolve().parents[2]


def state(seed):
    """Incompressible arrays (random float32), so the data file holds them as raw bytes, like a trained model's."""
    rng = np.random.default_rng(seed)
    return {
        "w": jnp.asarray(rng.standard_normal((512, 512), dtype=np.float32)),
        "b": jnp.asarray(rng.standard_normal(512, dtype=np.float32)),
        "step": jnp.int32(seed),
    }


def damage_middle(path, seed) -> None:
    """Up to 4 KiB of random bytes over the middle of a file, its size unchanged."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(size // 2)
        f.write(np.random.default_rng(seed).bytes(min(4096, size - size // 2)))
    assert path.stat().st_size == size


def corrupt_largest_file(step_dir, seed=0):
    damage_middle(max((p for p in step_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size), seed)


def corrupt_every_data_file(step_dir, seed=0):
    """Damage the middle of each of the step's data files (orbax's `d/` folders), for a tiny model's step: its values
    can be split over files smaller than an index file the restore no longer reads, so its largest file may hold
    nothing a restore uses (damaging it alone was seen to leave the step intact)."""
    data = sorted(p for p in step_dir.rglob("*") if p.is_file() and p.parent.name == "d")
    assert data, f"no data file under {step_dir}"
    for index, path in enumerate(data):
        damage_middle(path, [seed, index])


def test_a_checkpoint_with_corrupted_bytes_is_skipped_for_the_previous_one(tmp_path, caplog):
    ckpts = checkpoints.Checkpoints(tmp_path, keep=3)
    ckpts.save(1, state(1))
    ckpts.save(2, state(2))
    ckpts.close()
    corrupt_largest_file(tmp_path / "checkpoints" / "2")
    abstract = jax.eval_shape(lambda: state(0))
    ckpts = checkpoints.Checkpoints(tmp_path, keep=3)
    with caplog.at_level(logging.WARNING):
        restored, step = ckpts.restore_latest(abstract)
    assert step == 1
    for name, value in state(1).items():
        np.testing.assert_array_equal(restored[name], value)
    assert [r.message for r in caplog.records if "checkpoint 2" in r.message]  # one warning names it
    assert ckpts.latest.all_steps() == [1]  # known bad: deleted, never picked again, and step 2 is saved anew
    ckpts.close()


def test_an_intact_checkpoint_restores_bit_for_bit(tmp_path):
    ckpts = checkpoints.Checkpoints(tmp_path, keep=3)
    ckpts.save(3, state(3))
    restored, step = ckpts.restore_latest(jax.eval_shape(lambda: state(0)))
    ckpts.close()
    assert step == 3
    for name, value in state(3).items():
        np.testing.assert_array_equal(restored[name], value)


def test_a_checkpoint_of_other_shapes_is_a_config_mismatch_not_damage(tmp_path):
    ckpts = checkpoints.Checkpoints(tmp_path, keep=3)
    ckpts.save(1, state(1))
    other = {**state(1), "w": jnp.zeros((256, 512), jnp.float32)}  # what another model config builds
    with pytest.raises(checkpoints.ConfigMismatch, match=r"w .*\(512, 512\).*\(256, 512\)"):
        ckpts.restore_latest(jax.eval_shape(lambda: other))
    with pytest.raises(checkpoints.ConfigMismatch, match=r"extra"):
        ckpts.restore_latest(jax.eval_shape(lambda: {**state(1), "extra": jnp.zeros(3)}))
    ckpts.close()
    assert not (tmp_path / "checkpoints" / checkpoints.DAMAGED).exists()  # nothing moved: the checkpoint is intact
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["1"]


def reopened_latest(workdir):
    """(state, step) that a fresh `Checkpoints` over `workdir` restores as the latest intact one."""
    ckpts = checkpoints.Checkpoints(workdir, keep=3)
    try:
        return ckpts.restore_latest(jax.eval_shape(lambda: state(0)))
    finally:
        ckpts.close()


def save_the_old_way(workdir, step, tree, checksums=True, dev_loss=None):
    """Step `step` as this module wrote it before a step had two items: orbax's single (default) item, then
    `checksums.json` beside it in a second write (left out: a kill between the two); with `dev_loss`, in best/."""
    folder = workdir / ("checkpoints" if dev_loss is None else "best")
    options = {} if dev_loss is None else {"best_fn": lambda m: m["dev_loss"], "best_mode": "min"}
    manager = checkpoints.ocp.CheckpointManager(folder, options=checkpoints.ocp.CheckpointManagerOptions(**options))
    metrics = None if dev_loss is None else {"dev_loss": dev_loss}
    manager.save(step, args=checkpoints.ocp.args.StandardSave(tree), metrics=metrics)
    manager.wait_until_finished()
    manager.close()
    if checksums:
        (folder / str(step) / checkpoints.CHECKSUM_FILE).write_text(
            json.dumps(checkpoints._named_checksums(tree), indent=0)
        )
    assert (folder / str(step) / checkpoints.LEGACY_STATE).is_dir()


def test_a_step_is_saved_with_its_checksums_as_one_orbax_save(tmp_path):
    ckpts = checkpoints.Checkpoints(tmp_path, keep=3)
    ckpts.save(1, state(1))
    ckpts.close()
    step = tmp_path / "checkpoints" / "1"
    assert sorted(p.name for p in step.iterdir() if p.is_dir()) == [checkpoints.CHECKSUMS, checkpoints.STATE]
    assert json.loads((step / checkpoints.CHECKSUMS / checkpoints.CHECKSUM_FILE).read_text()) == {
        name: int(value) for name, value in checkpoints._named_checksums(state(1)).items()
    }


def test_steps_written_before_the_checksums_item_restore_verified_and_rotate(tmp_path):
    for step in (1, 2, 3):
        save_the_old_way(tmp_path, step, state(step))
    save_the_old_way(tmp_path, 3, state(3), dev_loss=1.5)
    corrupt_largest_file(tmp_path / "checkpoints" / "3")  # still verified: damage is found, the previous one used
    restored, step = reopened_latest(tmp_path)
    assert step == 2
    for name, value in state(2).items():
        np.testing.assert_array_equal(restored[name], value)
    assert (tmp_path / "checkpoints" / checkpoints.DAMAGED / "3").is_dir()
    ckpts = checkpoints.Checkpoints(tmp_path, keep=2)
    ckpts.save(4, state(4))  # the newest 2 are kept, old and new layout alike
    ckpts.save_if_best(4, state(4), dev_loss=2.0)  # worse than the old best: the old one stays
    ckpts.close()
    assert steps(tmp_path / "checkpoints") == [2, 4] and steps(tmp_path / "best") == [3]
    reader = checkpoints.Checkpoints(tmp_path, keep=2, read_only=True)
    restored, step, folder = reader.restore_for_eval(jax.eval_shape(lambda: state(0)))
    reader.close()
    assert (step, folder) == (3, tmp_path / "best")
    np.testing.assert_array_equal(restored["w"], state(3)["w"])


def test_an_old_step_without_its_checksums_is_not_restored_unchecked(tmp_path):
    save_the_old_way(tmp_path, 1, state(1))
    save_the_old_way(tmp_path, 2, state(2), checksums=False)  # a kill between the save and its checksums
    corrupt_largest_file(tmp_path / "checkpoints" / "2")
    restored, step = reopened_latest(tmp_path)
    assert step == 1
    np.testing.assert_array_equal(restored["w"], state(1)["w"])
    assert (tmp_path / "checkpoints" / checkpoints.DAMAGED / "2").is_dir()


def test_a_step_whose_checksums_were_lost_is_not_restored_unchecked(tmp_path):
    ckpts = checkpoints.Checkpoints(tmp_path, keep=3)
    ckpts.save(1, state(1))
    ckpts.save(2, state(2))
    ckpts.close()
    shutil.rmtree(tmp_path / "checkpoints" / "2" / checkpoints.CHECKSUMS)  # damage: a save never leaves this
    corrupt_largest_file(tmp_path / "checkpoints" / "2")
    restored, step = reopened_latest(tmp_path)
    assert step == 1
    np.testing.assert_array_equal(restored["w"], state(1)["w"])
    assert (tmp_path / "checkpoints" / checkpoints.DAMAGED / "2").is_dir()


def test_an_intact_best_state_is_used_when_every_latest_checkpoint_is_damaged(tmp_path):
    ckpts = checkpoints.Checkpoints(tmp_path, keep=3)
    ckpts.save(2, state(2))
    ckpts.save_if_best(2, state(2), 1.5)
    ckpts.close()
    corrupt_largest_file(tmp_path / "checkpoints" / "2")
    restored, step = reopened_latest(tmp_path)
    assert step == 2
    np.testing.assert_array_equal(restored["w"], state(2)["w"])


def steps(folder) -> list[int]:
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def test_rotation_never_deletes_the_protected_step(tmp_path):
    small = lambda step: {"w": jnp.full((4,), step, jnp.float32)}
    ckpts = checkpoints.Checkpoints(tmp_path, keep=2, protected=3)
    for step in range(1, 8):
        ckpts.save(step, small(step))
    assert ckpts.latest.all_steps() == [3, 6, 7]
    ckpts.close()
    assert steps(tmp_path / "checkpoints") == [3, 6, 7]


def test_best_keeps_the_lowest_dev_loss_across_runs(tmp_path):
    small = lambda step: {"w": jnp.full((4,), step, jnp.float32)}
    ckpts = checkpoints.Checkpoints(tmp_path, keep=2)
    ckpts.save_if_best(1, small(1), dev_loss=2.0)
    ckpts.save_if_best(2, small(2), dev_loss=3.0)
    ckpts.close()
    assert steps(tmp_path / "best") == [1]
    ckpts = checkpoints.Checkpoints(tmp_path, keep=2)  # a resume: the kept step's loss is read back from disk
    ckpts.save_if_best(3, small(3), dev_loss=2.5)
    ckpts.wait()
    assert steps(tmp_path / "best") == [1]
    ckpts.save_if_best(4, small(4), dev_loss=1.0)
    ckpts.close()
    assert steps(tmp_path / "best") == [4]


KILLED_MID_SAVE = textwrap.dedent(
    """
    import sys, time
    import jax.numpy as jnp
    from training import checkpoints
    from tests.training.test_checkpoints import state

    ckpts = checkpoints.Checkpoints(sys.argv[1], keep=3)
    ckpts.save(1, state(1))
    ckpts.wait()
    big = {**state(2), "more": jnp.ones((4096, 4096), jnp.float32)}  # 64 MiB: a write that takes a while
    ckpts.save(2, big)  # returns with the files still being written
    print("saving", flush=True)
    time.sleep(60)
    """
)


def test_a_kill_during_a_save_leaves_whole_steps_only(tmp_path):
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_MID_SAVE, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert child.stdout.readline() == "saving\n"
    finally:
        child.kill()  # SIGKILL: no handler, no clean-up
        child.wait()
    on_disk = steps(tmp_path / "checkpoints")
    assert on_disk in ([1], [1, 2])  # the step being written is there whole or not at all
    for step in on_disk:
        assert (tmp_path / "checkpoints" / str(step) / checkpoints.CHECKSUMS / checkpoints.CHECKSUM_FILE).is_file()
    extra = {"more": jnp.ones((4096, 4096), jnp.float32)} if on_disk[-1] == 2 else {}
    ckpts = checkpoints.Checkpoints(tmp_path, keep=3)
    restored, step = ckpts.restore_latest(jax.eval_shape(lambda: {**state(0), **extra}))
    assert step == on_disk[-1] and not (tmp_path / "checkpoints" / checkpoints.DAMAGED).exists()  # verified
    np.testing.assert_array_equal(restored["w"], state(step)["w"])
    ckpts.save(3, state(3))  # what the kill left behind stops no later save
    ckpts.close()
    assert steps(tmp_path / "checkpoints") == on_disk + [3]


def fail_when_waited_for(manager):
    """`manager.wait_until_finished` as it behaves when its background write ran out of space: the first wait raises
    (orbax raises a failed write once)."""
    finish, raised = manager.wait_until_finished, []

    def full_disk():
        finish()
        if not raised:
            raised.append(True)
            raise ValueError("async save failed") from OSError(errno.ENOSPC, "No space left on device")

    return full_disk


def test_a_write_that_fails_after_the_save_returned_names_its_step_folder(tmp_path, monkeypatch):
    ckpts = checkpoints.Checkpoints(tmp_path, keep=2)
    ckpts.save(5, state(5))
    monkeypatch.setattr(ckpts.latest, "wait_until_finished", fail_when_waited_for(ckpts.latest))
    with pytest.raises(OSError) as raised:
        ckpts.save(6, state(6))  # the next save waits for the one before: the error names step 5, not 6
    assert user_errors.one_line(raised.value).startswith(f"{tmp_path / 'checkpoints' / '5'}: No space left on device")
    monkeypatch.undo()
    ckpts.save(6, state(6))
    ckpts.save_if_best(6, state(6), dev_loss=1.0)
    monkeypatch.setattr(ckpts.best, "wait_until_finished", fail_when_waited_for(ckpts.best))
    with pytest.raises(OSError) as raised:
        ckpts.close()  # the end of a run waits for both folders
    assert user_errors.one_line(raised.value).startswith(f"{tmp_path / 'best' / '6'}: No space left on device")
    assert steps(tmp_path / "checkpoints") == [5, 6]


async def _read_array_index_and_device_put():  # named as orbax's read of one array index
    raise Exception("Encountered error while reading array index")


def hook_args(exc_value, obj=None):
    return SimpleNamespace(
        exc_type=type(exc_value), exc_value=exc_value, exc_traceback=exc_value.__traceback__, err_msg=None, object=obj
    )


def test_only_the_tracebacks_of_a_damaged_restores_abandoned_reads_are_dropped(monkeypatch):
    printed = []  # what Python's own hooks would have printed
    monkeypatch.setattr(sys, "unraisablehook", lambda args: printed.append(("unraisable", args.exc_value)))
    monkeypatch.setattr(sys, "excepthook", lambda kind, value, tb: printed.append(("except", value)))
    checkpoints.quiet_abandoned_reads()
    checkpoints.quiet_abandoned_reads()  # installed once, not wrapped twice
    loop = asyncio.new_event_loop()
    loop.close()
    with pytest.raises(RuntimeError, match="Event loop is closed") as finishing_read:
        loop.call_soon_threadsafe(print)  # what a read finishing after orbax closed its loop does
    read = _read_array_index_and_device_put()
    elsewhere = RuntimeError("Event loop is closed")  # the same words, not raised by call_soon_threadsafe
    unrelated = ValueError("a real problem")
    sys.excepthook(RuntimeError, finishing_read.value, finishing_read.value.__traceback__)
    sys.unraisablehook(hook_args(finishing_read.value))
    sys.unraisablehook(hook_args(Exception("Encountered error while reading array index"), obj=read))
    sys.excepthook(RuntimeError, elsewhere, None)
    sys.unraisablehook(hook_args(unrelated))
    read.close()
    assert printed == [("except", elsewhere), ("unraisable", unrelated)]
