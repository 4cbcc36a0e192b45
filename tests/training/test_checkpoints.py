"""Checkpoints are verified on restore: bytes corrupted on disk (size unchanged) are caught, not trained on."""

import logging

import jax
import jax.numpy as jnp
import numpy as np

from training import checkpoints


def state(seed):
    """Incompressible arrays (random float32), so the data file holds them as raw bytes, like a trained model's."""
    rng = np.random.default_rng(seed)
    return {"w": jnp.asarray(rng.standard_normal((512, 512), dtype=np.float32)),
            "b": jnp.asarray(rng.standard_normal(512, dtype=np.float32)), "step": jnp.int32(seed)}


def corrupt_largest_file(step_dir, seed=0):
    largest = max((p for p in step_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    size = largest.stat().st_size
    with open(largest, "r+b") as f:  # 4 KiB of random bytes in the middle, the size unchanged
        f.seek(size // 2)
        f.write(np.random.default_rng(seed).bytes(4096))
    assert largest.stat().st_size == size


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
