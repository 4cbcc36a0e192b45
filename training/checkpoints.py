"""Orbax checkpoints: the latest K train states, the best one by dev loss, and verified restore.

Each saved step also gets `checksums.json`: one 32-bit position-weighted sum of every array's
bits. Orbax reads bytes that were damaged on disk without complaint when they sit in raw
(incompressible) blocks, so a restore recomputes the sums and treats a mismatch like an
unreadable checkpoint: skipped with a warning, the previous one restored. A step without its
checksums (a kill between the save and them) cannot be checked and is skipped the same way.

Before any of that, the arrays a step holds (names, shapes, dtypes, from its metadata) are compared
with the state the config builds: a difference is the config's, not damage (`ConfigMismatch`,
naming the array and both shapes; nothing is moved). When no step in `checkpoints/` is intact, an
intact state in `best/` is restored instead.

A writer (the training loop) moves a damaged step aside to `checkpoints/damaged/STEP` (kept, never
reused as a name, never deleted); a reader (`read_only=True`: eval.py, analyses) only skips it.
When every step is damaged there is nothing to resume from: `NoIntactCheckpoint`, not a restart.

Orbax reads a step's arrays as concurrent tasks and stops at the first one that fails; the other reads of a
damaged step are left behind, and when they end after orbax has closed its event loop Python prints their
tracebacks ("Exception ignored in: <coroutine object _read_array_index_and_device_put>", "RuntimeError: Event
loop is closed"), thousands of lines around the one that reports the step. From a process's first restore on,
those two are logged at debug level instead (`quiet_abandoned_reads`); any other traceback passes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from training.core import files
from training.core.errors import RunRefused
from training.parallel import distributed

CHECKSUM_FILE = "checksums.json"
DAMAGED = "damaged"  # checkpoints/damaged/STEP: steps a writer found unreadable, kept aside
DIVERGED = "diverged"  # checkpoints/diverged/STEP: a step whose parameters gave a diverged loss, kept aside
_UNSIGNED = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}


class NoIntactCheckpoint(RunRefused):
    """Every checkpoint of a run is damaged: resuming is impossible and restarting must be asked for."""


class ConfigMismatch(RunRefused):
    """The checkpoints hold arrays other than those the requested config builds: another run's config."""


class Checkpoints:
    """`workdir/checkpoints` keeps the latest `keep` states; `workdir/best` the one with the lowest dev loss.

    read_only: a reader's view, which creates, moves and deletes nothing (a run may be training there).
    protected: a step that rotation never deletes (the last good checkpoint of a divergence stop).
    """

    def __init__(self, workdir: str | Path, keep: int, read_only: bool = False, protected: int | None = None):
        workdir = Path(workdir).absolute()
        self.read_only, self.keep, self.protected = read_only, keep, protected
        self.latest = ocp.CheckpointManager(
            workdir / "checkpoints",
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep if protected is None else None, read_only=read_only, create=not read_only
            ),
        )
        self.best = ocp.CheckpointManager(
            workdir / "best",
            options=ocp.CheckpointManagerOptions(
                max_to_keep=1,
                best_fn=lambda m: m["dev_loss"],
                best_mode="min",
                read_only=read_only,
                create=not read_only,
            ),
        )

    def save(self, step: int, state) -> None:
        try:
            with _quiet_refusals():
                self._save(step, state)
        except Exception as error:  # a full disk or read-only mount: one error naming the step's folder
            if refusal := files.naming(error, Path(self.latest.directory) / str(step)):
                raise refusal from error
            raise

    def _save(self, step: int, state) -> None:
        if step not in self.latest.all_steps():
            self.latest.save(step, args=ocp.args.StandardSave(state))
            self.latest.wait_until_finished()
            _write_checksums(self.latest, step, state)
            if self.protected is not None:  # rotation by hand: the `keep` newest and the protected step
                rotated = sorted(s for s in self.latest.all_steps() if s != self.protected)
                for old in rotated[: max(0, len(rotated) - self.keep)]:
                    self.latest.delete(old)

    def save_if_best(self, step: int, state, dev_loss: float) -> None:
        try:
            with _quiet_refusals():
                self._save_if_best(step, state, dev_loss)
        except Exception as error:
            if refusal := files.naming(error, Path(self.best.directory) / str(step)):
                raise refusal from error
            raise

    def _save_if_best(self, step: int, state, dev_loss: float) -> None:
        if self.best.save(step, args=ocp.args.StandardSave(state), metrics={"dev_loss": dev_loss}):
            self.best.wait_until_finished()
            _write_checksums(self.best, step, state)

    def restore_latest(self, abstract_state):
        """(state, step) from the newest intact checkpoint, skipping damaged ones; (None, 0) if there is none at all.

        A writer moves the damaged ones to `checkpoints/damaged/`; NoIntactCheckpoint if every one is damaged.
        """
        state, step, unreadable = _restore_newest(self.latest, abstract_state)
        if unreadable and not self.read_only:
            self.move_aside(unreadable)
        if state is None and unreadable:
            state, step, _ = _restore_newest(self.best, abstract_state)
            if state is not None:
                logging.warning(
                    "no intact checkpoint in %s; resuming from the intact step %d in %s",
                    self.latest.directory,
                    step,
                    self.best.directory,
                )
                return state, step
            where = f"moved to {Path(self.latest.directory) / DAMAGED}" if not self.read_only else "left in place"
            raise NoIntactCheckpoint(
                f"every checkpoint in {self.latest.directory} is damaged "
                f"(steps {', '.join(map(str, sorted(unreadable)))}, "
                f"{where}); nothing to resume from: pass --restart to start over (the old run is moved aside) "
                "or use a new --workdir"
            )
        return state, step

    def restore_for_eval(self, abstract_state):
        """(state, step, folder): the best checkpoint if there is one, else the latest.

        A best/ being replaced by a running train.py is read again (a few tries) before falling back, and
        the fallback is a warning naming both folders.
        """
        for _ in range(3):
            state, step, unreadable = _restore_newest(self.best, abstract_state)
            if state is not None or not unreadable:
                break
            time.sleep(1.0)  # orbax renames a finished save into place and then deletes the old step
            self.best.reload()
        if state is not None:
            return state, step, Path(self.best.directory)
        if unreadable:
            logging.warning(
                "no readable checkpoint in %s (steps %s); using the latest in %s instead",
                self.best.directory,
                sorted(unreadable),
                self.latest.directory,
            )
        state, step = self.restore_latest(abstract_state)
        return state, step, Path(self.latest.directory)

    def move_aside(self, steps, folder: str = DAMAGED) -> None:
        """Move `steps` to checkpoints/FOLDER/STEP[.N] (process 0), so their names are free for new saves."""

        def move():
            if not distributed.is_main():
                return
            aside = Path(self.latest.directory) / folder
            aside.mkdir(exist_ok=True)
            for step in steps:
                target, n = aside / str(step), 1
                while target.exists():
                    target, n = aside / f"{step}.{n}", n + 1
                os.replace(Path(self.latest.directory) / str(step), target)
                logging.warning("checkpoint %d moved to %s", step, target)

        distributed.main_first("checkpoints-moved-aside", move)
        self.latest.reload()
        self.latest.reload()

    def close(self) -> None:
        self.latest.close()
        self.best.close()


@jax.jit
def checksums(tree):
    """One uint32 per array: its bits (as unsigned ints) weighted by an odd multiple of their position, summed
    mod 2^32."""

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
    """ValueError naming the first array whose bits differ from what was saved, or saying there are no checksums."""
    path = Path(manager.directory) / str(step) / CHECKSUM_FILE
    if not path.exists():
        raise ValueError(f"{path} is missing (a save cut off before its checksums?): the arrays cannot be checked")
    saved = json.loads(path.read_text())
    for name, value in _named_checksums(state).items():
        if saved.get(name) != value:
            raise ValueError(f"array {name} does not match its checksum (damaged on disk)")


def _restore_newest(manager, abstract_state):
    """(state, step, unreadable steps) of the newest intact step; (None, 0, unreadable) if none restores."""
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
    quiet_abandoned_reads()  # before the restore: a damaged step's abandoned reads end while orbax still unwinds
    unreadable = []
    for step in sorted(manager.all_steps(), reverse=True):
        try:
            saved = _saved_arrays(manager, step)
        except Exception as error:  # unreadable metadata: damage, handled with the restore below
            saved = None
            logging.debug("metadata of checkpoint %d unreadable: %s", step, error)
        _check_same_arrays(manager, step, saved, target)
        try:
            state = manager.restore(step, args=ocp.args.StandardRestore(target))
            _verify(manager, step, state)
        except Exception as error:  # a half-written or damaged step: fall back to the previous one
            logging.warning(
                "checkpoint %d in %s is unreadable (%s); trying an older one",
                step,
                manager.directory,
                str(error).splitlines()[0][:200],
            )
            unreadable.append(step)
            continue
        return state, step, unreadable
    return None, 0, unreadable


_ABANDONED_READ = "_read_array_index_and_device_put"  # orbax's read of one array index (its serialization module)


def _abandoned_read(exc_value, exc_traceback, obj=None) -> bool:
    """Whether a traceback Python is about to print is the echo of a damaged restore's abandoned reads: orbax's read
    coroutine finalised unfinished, or a read finishing into orbax's closed event loop."""
    if getattr(obj, "__qualname__", None) == _ABANDONED_READ:
        return True
    frames = [frame.name for frame in traceback.extract_tb(exc_traceback)] if exc_traceback is not None else []
    return (
        isinstance(exc_value, RuntimeError)
        and str(exc_value) == "Event loop is closed"
        and "call_soon_threadsafe" in frames
    )


def quiet_abandoned_reads() -> None:
    """Route the tracebacks of orbax's abandoned reads (`_abandoned_read`) to a debug log line, for the rest of the
    process; every other traceback goes to the hooks that were there. Installed once."""
    if getattr(sys.unraisablehook, "quiets_abandoned_reads", False):
        return
    previous_unraisable, previous_except = sys.unraisablehook, sys.excepthook

    def unraisable(hook_args) -> None:
        if _abandoned_read(hook_args.exc_value, hook_args.exc_traceback, hook_args.object):
            logging.debug("a damaged checkpoint's abandoned read ended: %s", hook_args.exc_value)
            return
        previous_unraisable(hook_args)

    def excepthook(exc_type, exc_value, exc_traceback) -> None:
        if _abandoned_read(exc_value, exc_traceback):
            logging.debug("a damaged checkpoint's abandoned read ended: %s", exc_value)
            return
        previous_except(exc_type, exc_value, exc_traceback)

    unraisable.quiets_abandoned_reads = True  # type: ignore[attr-defined]
    sys.unraisablehook, sys.excepthook = unraisable, excepthook


def _path_name(path) -> str:
    return ".".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def _arrays(tree) -> dict[str, tuple[tuple[int, ...], str]]:
    """{dotted name: (shape, dtype)} of a tree's array leaves."""
    return {
        _path_name(path): (tuple(leaf.shape), str(leaf.dtype))
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
        if hasattr(leaf, "shape")
    }


class _RefusalFilter(logging.Filter):
    """Drops orbax's logged tracebacks of a file-system refusal: the save raises it once, naming the step's folder."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "orbax" not in record.pathname or record.levelno < logging.ERROR:
            return True
        text = record.getMessage() + "".join(str(e) for e in (record.exc_info or ())[1:2])
        return files.refusal_code(text) is None and "No space left" not in text and "Read-only file system" not in text


@contextlib.contextmanager
def _quiet_refusals():
    quiet = _RefusalFilter()
    logger = logging.getLogger("absl")  # orbax logs through absl's logger, from its save threads too
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _saved_arrays(manager, step: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """{name: (shape, dtype)} of the arrays step `step` holds, from its metadata alone (the arrays are not read)."""
    metadata = ocp.StandardCheckpointHandler().metadata(Path(manager.directory) / str(step) / "default")
    return _arrays(getattr(metadata, "tree", metadata))


def _check_same_arrays(manager, step: int, saved: dict | None, target) -> None:
    """ConfigMismatch naming the first array that checkpoint `step` and the config's state hold differently.

    The names come from the step's checksums.json (a file apart from orbax's, so damage to the arrays leaves them),
    the shapes and dtypes from orbax's metadata (`saved`, None when unreadable). Damage that leaves either unreadable
    is not a mismatch: the restore finds it.
    """
    wanted, what = _arrays(target), None
    try:
        named = set(json.loads((Path(manager.directory) / str(step) / CHECKSUM_FILE).read_text()))
    except (OSError, ValueError, TypeError):  # missing or garbled: the restore's verification reports it
        named = None
    if named is not None:
        keys = {jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_leaves_with_path(target)}
        if missing := sorted(keys - named):
            what = f"has no array {missing[0]}, which the requested config builds"
        elif extra := sorted(named - keys):
            what = f"holds an array {extra[0]}, which the requested config does not build"
    for name in sorted(set(saved or {}) & set(wanted)):
        if what is None and saved[name] != wanted[name]:
            what = (
                f"holds {name} {saved[name][0]} {saved[name][1]}, but the requested config builds "
                f"{wanted[name][0]} {wanted[name][1]}"
            )
    if what:
        raise ConfigMismatch(
            f"checkpoint {step} in {manager.directory} {what}: the requested config is not this run's "
            "(resume with the config in its config.json, pass --restart to start over, or use a new --workdir)"
        )
