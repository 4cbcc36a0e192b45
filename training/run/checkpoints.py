"""Orbax checkpoints: the latest K train states, the best one by dev loss, and verified restore.

Each saved step also gets `checksums.json`: one 32-bit position-weighted sum of every array's
bits. Orbax reads bytes that were damaged on disk without complaint when they sit in raw
(incompressible) blocks, so a restore recomputes the sums and treats a mismatch like an
unreadable checkpoint: skipped with a warning, the previous one restored.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from training.parallel import distributed
from training.run import files

CHECKSUM_FILE = "checksums.json"
_UNSIGNED = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}


class Checkpoints:
    """`workdir/checkpoints` keeps the latest `keep` states; `workdir/best` the one with the lowest dev loss."""

    def __init__(self, workdir: str | Path, keep: int):
        workdir = Path(workdir).absolute()
        self.latest = ocp.CheckpointManager(workdir / "checkpoints", options=ocp.CheckpointManagerOptions(max_to_keep=keep))
        self.best = ocp.CheckpointManager(
            workdir / "best",
            options=ocp.CheckpointManagerOptions(max_to_keep=1, best_fn=lambda m: m["dev_loss"], best_mode="min"),
        )

    def save(self, step: int, state) -> None:
        if step not in self.latest.all_steps():
            self.latest.save(step, args=ocp.args.StandardSave(state))
            self.latest.wait_until_finished()
            _write_checksums(self.latest, step, state)

    def save_if_best(self, step: int, state, dev_loss: float) -> None:
        if self.best.save(step, args=ocp.args.StandardSave(state), metrics={"dev_loss": dev_loss}):
            self.best.wait_until_finished()
            _write_checksums(self.best, step, state)

    def restore_latest(self, abstract_state):
        """(state, step) from the newest intact checkpoint, skipping damaged ones; (None, 0) if none."""
        return _restore_newest(self.latest, abstract_state)

    def restore_for_eval(self, abstract_state):
        """The best checkpoint if there is one, else the latest: (state, step)."""
        state, step = _restore_newest(self.best, abstract_state)
        return (state, step) if state is not None else self.restore_latest(abstract_state)

    def close(self) -> None:
        self.latest.close()
        self.best.close()


@jax.jit
def checksums(tree):
    """One uint32 per array: its bits (as unsigned ints) weighted by an odd multiple of their position, summed mod 2^32."""

    def one(x):
        bits = jax.lax.bitcast_convert_type(x, _UNSIGNED[x.dtype.itemsize]).reshape(-1).astype(jnp.uint32)
        weights = jnp.arange(bits.size, dtype=jnp.uint32) * jnp.uint32(2654435761) + jnp.uint32(1)
        return jnp.sum(bits * weights, dtype=jnp.uint32)

    return jax.tree.map(one, tree)


def _named_checksums(state) -> dict[str, int]:
    sums = jax.device_get(checksums(state))
    return {jax.tree_util.keystr(path): int(value) for path, value in jax.tree_util.tree_leaves_with_path(sums)}


def _write_checksums(manager, step: int, state) -> None:
    sums = _named_checksums(state)  # every process computes (the arrays may be sharded over all of them)
    step_dir = Path(manager.directory) / str(step)
    if distributed.is_main() and step_dir.is_dir():  # `best` may already have dropped a step that was not better
        files.write_atomic(step_dir / CHECKSUM_FILE, json.dumps(sums, indent=0))


def _verify(manager, step: int, state) -> None:
    """ValueError naming the first array whose bits differ from what was saved (no checksums: older checkpoint, accepted)."""
    path = Path(manager.directory) / str(step) / CHECKSUM_FILE
    if not path.exists():
        return
    saved = json.loads(path.read_text())
    for name, value in _named_checksums(state).items():
        if saved.get(name) != value:
            raise ValueError(f"array {name} does not match its checksum (damaged on disk)")


def _restore_newest(manager, abstract_state):
    """Restore the newest intact step; damaged newer steps are deleted so that saving resumes and none is picked twice."""
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
    unreadable = []
    for step in sorted(manager.all_steps(), reverse=True):
        try:
            state = manager.restore(step, args=ocp.args.StandardRestore(target))
            _verify(manager, step, state)
        except Exception as error:  # a half-written or damaged step: fall back to the previous one
            logging.warning("checkpoint %d in %s is unreadable (%s); trying an older one", step, manager.directory, str(error).splitlines()[0][:200])
            unreadable.append(step)
            continue
        for bad in unreadable:  # orbax saves nothing at or below its latest step
            manager.delete(bad)
        return state, step
    return None, 0
