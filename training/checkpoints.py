"""Orbax checkpoints: the latest K train states, the best one by dev loss, and verified restore.

A step is two orbax items, written as one save: `state/` (the train state) and `checksums/` (one 32-bit
position-weighted sum of every array's bits, in `checksums.json`). Orbax writes a step in a temporary folder and
renames it into place once every item is written, so a kill leaves no step or a whole one: never a state without its
checksums. Which steps stay is orbax's preservation policy: in `checkpoints/` the newest `keep` (and the protected
step of a divergence stop), in `best/` the one with the lowest dev loss. A save returns once the arrays are copied
off the devices; the files are written in the background, and `wait` (also `close`, `move_aside` and the next save)
waits for them, raising a failed write's error (a full disk) as one naming that step's folder.

Steps written before the two items (the state in `default/`, `checksums.json` beside it) are still restored and
verified the same way; one of those without its `checksums.json` (a kill between its two writes) is skipped like a
damaged one: nothing is restored unchecked.

What stays hand-written, and why:

- The checksums. Orbax reads bytes that were damaged on disk without complaint when they sit in raw
  (incompressible) blocks, so a restore recomputes the sums and treats a mismatch like an unreadable checkpoint:
  skipped with a warning, the previous one restored.
- The choice of step to restore. Orbax restores the step it is given; falling back from a damaged step to the next
  older one, and from `checkpoints/` to an intact state in `best/`, is this module's.
- The config check. Before any of that, the arrays a step holds (names from its checksums, shapes and dtypes from
  orbax's item metadata) are compared with the state the config builds: a difference is the config's, not damage
  (`ConfigMismatch`, naming the array and both shapes; nothing is moved). Orbax's own error for it reads like damage.
- Moving steps aside. Orbax only deletes; a writer (the training loop) moves a damaged step to
  `checkpoints/damaged/STEP` (kept, never reused as a name, never deleted) and a diverged one to
  `checkpoints/diverged/STEP`, so the step can be saved again and the old one inspected. A reader
  (`read_only=True`: eval.py, analyses) only skips it. When every step is damaged there is nothing to resume from:
  `NoIntactCheckpoint`, not a restart.
- The quieting of tracebacks. Orbax reads a step's arrays as concurrent tasks and stops at the first one that fails;
  the other reads of a damaged step are left behind, and when they end after orbax has closed its event loop Python
  prints their tracebacks ("Exception ignored in: <coroutine object _read_array_index_and_device_put>",
  "RuntimeError: Event loop is closed"), thousands of lines around the one that reports the step. From a process's
  first restore on, those two are logged at debug level instead (`quiet_abandoned_reads`); any other traceback
  passes. Orbax also logs a refused write (full disk, read-only mount) from its threads, which the error naming the
  step's folder already says: those records are dropped while a writer is open.
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

STATE, CHECKSUMS = "state", "checksums"  # a step's two items: STEP/state/, STEP/checksums/CHECKSUM_FILE
CHECKSUM_FILE = "checksums.json"
LEGACY_STATE = "default"  # an older step's state, STEP/default/, with STEP/CHECKSUM_FILE beside it: read, never written
DAMAGED = "damaged"  # checkpoints/damaged/STEP: steps a writer found unreadable, kept aside
DIVERGED = "diverged"  # checkpoints/diverged/STEP: a step whose parameters gave a diverged loss, kept aside
_UNSIGNED = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}


class NoIntactCheckpoint(RunRefused):
    """Every checkpoint of a run is damaged: resuming is impossible and restarting must be asked for."""


class ConfigMismatch(RunRefused):
    """The checkpoints hold arrays other than those the requested config builds: another run's config."""


def _dev_loss(metrics) -> float:
    return metrics["dev_loss"]


def _manager(directory: Path, policy, read_only: bool, **options) -> ocp.CheckpointManager:
    """A manager of steps made of the items STATE and CHECKSUMS (and LEGACY_STATE, to read older steps).

    Item handlers, not a handler registry: with a registry orbax decides single or several items from the first
    step it touches, which in a workdir from before the two items is an old single-item step, and then refuses the
    two-item saves."""
    return ocp.CheckpointManager(
        directory,
        item_handlers={
            STATE: ocp.StandardCheckpointHandler(),
            CHECKSUMS: ocp.JsonCheckpointHandler(filename=CHECKSUM_FILE),
            LEGACY_STATE: ocp.StandardCheckpointHandler(),
        },
        options=ocp.CheckpointManagerOptions(
            preservation_policy=policy, read_only=read_only, create=not read_only, **options
        ),
    )


class Checkpoints:
    """`workdir/checkpoints` keeps the latest `keep` states; `workdir/best` the one with the lowest dev loss.

    read_only: a reader's view, which creates, moves and deletes nothing (a run may be training there).
    protected: a step that rotation never deletes (the last good checkpoint of a divergence stop).
    """

    def __init__(self, workdir: str | Path, keep: int, read_only: bool = False, protected: int | None = None):
        workdir = Path(workdir).absolute()
        self.read_only, self.keep, self.protected = read_only, keep, protected
        policies = ocp.checkpoint_managers
        newest = policies.LatestN(keep)
        self.latest = _manager(
            workdir / "checkpoints",
            newest
            if protected is None
            else policies.AnyPreservationPolicy([newest, policies.CustomSteps([protected])]),
            read_only,
        )
        self.best = _manager(
            workdir / "best",
            policies.BestN(get_metric_fn=_dev_loss, reverse=True, n=1),  # reverse: the lowest loss ranks highest
            read_only,
            best_fn=_dev_loss,  # not for the policy (which overrides it): orbax writes a step's metrics only with it
            best_mode="min",
        )
        self._in_flight: dict[int, int] = {}  # id(manager): the step it is writing
        self._quiet = _RefusalFilter()
        if not read_only:  # orbax logs through absl's logger, from its save threads too
            logging.getLogger("absl").addFilter(self._quiet)

    def save(self, step: int, state) -> None:
        """Start saving `state` as step `step` of checkpoints/ (nothing if the step is there already)."""
        if step not in self.latest.all_steps():
            self._start(self.latest, step, state)

    def save_if_best(self, step: int, state, dev_loss: float) -> None:
        """Start saving `state` as step `step` of best/; orbax's policy then keeps it only if its loss is the lowest."""
        self._start(self.best, step, state, {"dev_loss": dev_loss})

    def _start(self, manager, step: int, state, metrics: dict | None = None) -> None:
        self._finish(manager)  # orbax would wait for it inside `save`: here its error names its own step
        sums = _named_checksums(state)  # every process computes (the arrays may be sharded over all of them)
        with _naming(manager, step):
            manager.save(
                step,
                args=ocp.args.Composite(**{STATE: ocp.args.StandardSave(state), CHECKSUMS: ocp.args.JsonSave(sums)}),
                metrics=metrics,
            )
        self._in_flight[id(manager)] = step

    def _finish(self, manager) -> None:
        if (step := self._in_flight.pop(id(manager), None)) is not None:
            with _naming(manager, step):
                manager.wait_until_finished()

    def wait(self) -> None:
        """Block until every save started is on disk; a failed write raises, naming its step's folder."""
        try:
            self._finish(self.latest)
        finally:
            self._finish(self.best)

    def restore_latest(self, abstract_state):
        """(state, step) from the newest intact checkpoint, skipping damaged ones; (None, 0) if there is none at all.

        A writer moves the damaged ones to `checkpoints/damaged/`; NoIntactCheckpoint if every one is damaged.
        """
        self.wait()  # a step this process is still writing would read as damaged
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
        self.wait()
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
        self.wait()  # a step being written is still in orbax's temporary folder: move it once it has its name

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

    def close(self) -> None:
        """Wait for the saves in flight (their error raised, naming the step), then close both managers."""
        try:
            self.wait()
        finally:
            self.latest.close()  # a failed save has raised its error once: closing does not raise it again
            self.best.close()
            logging.getLogger("absl").removeFilter(self._quiet)


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


def _legacy(manager, step: int) -> bool:
    """Whether step `step` was written before the two items: its state in STEP/default/ (orbax's own test for a
    single-item step), its checksums in STEP/CHECKSUM_FILE."""
    return (Path(manager.directory) / str(step) / LEGACY_STATE).exists()


def _saved_checksums(manager, step: int) -> dict:
    """The checksums saved with step `step`: {array name: sum}; an error if they are missing or garbled."""
    if _legacy(manager, step):
        path = Path(manager.directory) / str(step) / CHECKSUM_FILE
        if not path.exists():
            raise ValueError(f"{path} is missing (a save cut off before its checksums?): the arrays cannot be checked")
        sums = json.loads(path.read_text())
    else:
        sums = manager.restore(step, args=ocp.args.Composite(**{CHECKSUMS: ocp.args.JsonRestore()}))[CHECKSUMS]
    if not isinstance(sums, dict):
        raise ValueError(f"the checksums of checkpoint {step} are not a JSON object: the arrays cannot be checked")
    return sums


def _verify(saved: dict, state) -> None:
    """ValueError naming the first array whose bits differ from the checksums `saved` with it."""
    for name, value in _named_checksums(state).items():
        if saved.get(name) != value:
            raise ValueError(f"array {name} does not match its checksum (damaged on disk)")


def _restore_newest(manager, abstract_state):
    """(state, step, unreadable steps) of the newest intact step; (None, 0, unreadable) if none restores."""
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
    quiet_abandoned_reads()  # before the restore: a damaged step's abandoned reads end while orbax still unwinds
    unreadable = []
    for step in sorted(manager.all_steps(), reverse=True):
        item = LEGACY_STATE if _legacy(manager, step) else STATE
        try:
            saved = _saved_arrays(manager, step, item)
        except Exception as error:  # unreadable metadata: damage, handled with the restore below
            saved = None
            logging.debug("metadata of checkpoint %d unreadable: %s", step, error)
        try:
            sums, unchecked = _saved_checksums(manager, step), None
        except Exception as error:  # missing or garbled: the step cannot be verified, handled below
            sums, unchecked = None, error
        _check_same_arrays(manager, step, saved, sums, target)
        try:
            if unchecked is not None:
                raise unchecked
            state = manager.restore(step, args=ocp.args.Composite(**{item: ocp.args.StandardRestore(target)}))[item]
            _verify(sums, state)
        except Exception as error:  # a half-written or damaged step: fall back to the previous one
            logging.warning(
                "checkpoint %d in %s is unreadable (%s); trying an older one",
                step,
                manager.directory,
                str(error).splitlines()[0][:200] if str(error) else type(error).__name__,
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
def _naming(manager, step: int):
    """A file-system refusal (full disk, read-only mount) raised inside as one error naming step `step`'s folder."""
    try:
        yield
    except Exception as error:
        if refusal := files.naming(error, Path(manager.directory) / str(step)):
            raise refusal from error
        raise


def _saved_arrays(manager, step: int, item: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """{name: (shape, dtype)} of the arrays step `step` holds in `item`, from orbax's item metadata alone (the arrays
    are not read)."""
    metadata = manager.metadata(step).item_metadata[item]
    return _arrays(getattr(metadata, "tree", metadata))


def _check_same_arrays(manager, step: int, saved: dict | None, sums: dict | None, target) -> None:
    """ConfigMismatch naming the first array that checkpoint `step` and the config's state hold differently.

    The names come from the step's checksums (`sums`: an item apart from the state's, so damage to the arrays leaves
    them), the shapes and dtypes from orbax's metadata (`saved`); either is None when unreadable. Damage that leaves
    either unreadable is not a mismatch: the restore finds it.
    """
    wanted, what = _arrays(target), None
    if sums is not None:
        named = set(sums)
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
