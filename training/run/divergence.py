"""Divergence: a non-finite or exploding training loss, non-finite parameters, an overflowing dev perplexity.

A diverged run stops with `NonFiniteLoss`, naming the last good checkpoint, and records in `DIVERGED_FILE` the
loss baseline a resume keeps watching against and the checkpoint the rotation must keep. The stacked trainer
stops a diverged seed alone with the same watch and record.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax

from training import checkpoints
from training.core import files
from training.core.errors import RunRefused
from training.core.metrics import MetricsWriter
from training.parallel import distributed

DIVERGED_FILE = "diverged.json"  # a divergence stop's loss baseline and its last good checkpoint (read on resume)


class NonFiniteLoss(RunRefused):
    """The run diverged: a non-finite or exploding loss (`config.divergence_factor`), non-finite
    parameters, or a dev loss whose perplexity overflows."""


class LossWatch:
    """Divergence in the training loss: non-finite, or above `factor` x the lowest running loss so far.

    The running loss is an exponential moving average over about ten steps (decay 0.9); its lowest value
    is where training got to, so a loss `factor` times above it is a blow-up, not noise (0: only non-finite).
    lowest: where a resumed run had got to (the lowest logged window mean), else None.
    """

    DECAY = 0.9

    def __init__(self, factor: float, lowest: float | None = None):
        self.factor, self.lowest, self.running = factor, lowest, None

    def check(self, loss: float) -> str | None:
        """Why `loss` means divergence, or None (then it joins the running loss)."""
        if not math.isfinite(loss):
            return f"loss is {loss}"
        if self.factor and self.lowest is not None and loss > self.factor * self.lowest:
            return (
                f"loss {loss:.4g} is above config.divergence_factor ({self.factor:g}) x the lowest running loss "
                f"({self.lowest:.4g})"
            )
        self.running = loss if self.running is None else self.DECAY * self.running + (1 - self.DECAY) * loss
        self.lowest = self.running if self.lowest is None else min(self.lowest, self.running)
        return None


def loss_watch(config, writer: MetricsWriter, baseline: float | None) -> LossWatch:
    """The divergence watch of a run resumed at the lowest loss it logged (or the divergence stop's `baseline`)."""
    logged = [r["loss"] for r in writer.records if "split" not in r and "loss" in r]
    return LossWatch(
        config.get("divergence_factor", 0.0), min(logged + ([baseline] if baseline is not None else []), default=None)
    )


@jax.jit
def all_finite(params):
    return jax.numpy.all(jax.numpy.stack([jax.numpy.isfinite(x).all() for x in jax.tree.leaves(params)]))


def check_finite(params, step, ckpts):
    """Never checkpoint a state that has gone non-finite: the last saved one stays the last good one."""
    if not bool(all_finite(params)):
        raise diverged_error(f"parameters are not finite after step {step}", ckpts)


def diverged_error(what: str, ckpts, insane: int | None = None) -> NonFiniteLoss:
    """The error that stops a diverged run, naming the checkpoint a resume would start from (if any).

    insane: a step whose checkpoint (if saved) holds the parameters that gave the bad loss: moved to
    checkpoints/diverged/, so the last one kept had a sane loss.
    """
    if insane is not None and insane in ckpts.latest.all_steps():
        ckpts.move_aside([insane], checkpoints.DIVERGED)
    steps = ckpts.latest.all_steps()
    where = (
        f"the last good checkpoint is step {max(steps)} in {ckpts.latest.directory} (its loss was sane)"
        if steps
        else "no checkpoint has been saved, so a resume starts from scratch"
    )
    return NonFiniteLoss(f"{what}; stopping without saving: {where}")


def read_divergence(workdir: Path) -> dict:
    """What the last divergence stop recorded in `workdir` (DIVERGED_FILE), or {}; ValueError naming a garbled file."""
    path = workdir / DIVERGED_FILE
    if not path.is_file():
        return {}
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        lowest, kept = record["lowest_running_loss"], record["kept_step"]
        if not (lowest is None or isinstance(lowest, float)) or not (kept is None or type(kept) is int):
            raise TypeError
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise ValueError(
            f"{path} is not a divergence record (expected JSON with lowest_running_loss and kept_step); "
            f"restore it from a copy, or remove it to resume without the stop's baseline"
        ) from None
    return record


def record_divergence(workdir: Path, lowest: float | None, ckpts) -> None:
    """Write DIVERGED_FILE (process 0): the loss baseline a resume keeps, and the checkpoint rotation must keep."""
    if distributed.is_main():
        steps = ckpts.latest.all_steps()
        files.write_atomic(
            workdir / DIVERGED_FILE,
            json.dumps({"lowest_running_loss": lowest, "kept_step": max(steps) if steps else None}, indent=2),
        )
