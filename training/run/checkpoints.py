"""Orbax checkpoints: the latest K train states, the best one by dev loss, and safe restore."""

from __future__ import annotations

import logging
from pathlib import Path

import jax
import orbax.checkpoint as ocp


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

    def save_if_best(self, step: int, state, dev_loss: float) -> None:
        self.best.save(step, args=ocp.args.StandardSave(state), metrics={"dev_loss": dev_loss})
        self.best.wait_until_finished()

    def restore_latest(self, abstract_state):
        """(state, step) from the newest readable checkpoint, skipping corrupt ones; (None, 0) if none."""
        return _restore_newest(self.latest, abstract_state)

    def restore_for_eval(self, abstract_state):
        """The best checkpoint if there is one, else the latest: (state, step)."""
        state, step = _restore_newest(self.best, abstract_state)
        return (state, step) if state is not None else self.restore_latest(abstract_state)

    def close(self) -> None:
        self.latest.close()
        self.best.close()


def _restore_newest(manager, abstract_state):
    """Restore the newest readable step; unreadable newer steps are deleted so that saving resumes."""
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
    unreadable = []
    for step in sorted(manager.all_steps(), reverse=True):
        try:
            state = manager.restore(step, args=ocp.args.StandardRestore(target))
        except Exception as error:  # a half-written or damaged step: fall back to the previous one
            logging.warning("checkpoint %d in %s is unreadable (%s); trying an older one", step, manager.directory, error)
            unreadable.append(step)
            continue
        for bad in unreadable:  # orbax saves nothing at or below its latest step
            manager.delete(bad)
        return state, step
    return None, 0
