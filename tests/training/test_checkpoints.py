"""Checkpoints are verified on restore: bytes corrupted on disk (size unchanged) are caught, not trained on."""

import asyncio
import logging
import sys
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from training import checkpoints


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


def test_a_checkpoint_without_its_checksums_is_not_restored_unchecked(tmp_path):
    ckpts = checkpoints.Checkpoints(tmp_path, keep=3)
    ckpts.save(1, state(1))
    ckpts.save(2, state(2))
    ckpts.close()
    (tmp_path / "checkpoints" / "2" / checkpoints.CHECKSUM_FILE).unlink()  # a kill between the save and its checksums
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


def test_rotation_never_deletes_the_protected_step(tmp_path):
    small = lambda step: {"w": jnp.full((4,), step, jnp.float32)}
    ckpts = checkpoints.Checkpoints(tmp_path, keep=2, protected=3)
    for step in range(1, 8):
        ckpts.save(step, small(step))
    assert ckpts.latest.all_steps() == [3, 6, 7]
    ckpts.close()


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
