"""Stopping on request: SIGTERM/SIGINT caught between steps, a run's time limit, an evaluation cut short.

A stop signal saves a checkpoint and ends the run at the end of a step; one that comes during a dev evaluation
leaves it to be redone when the run resumes (`interrupted_evaluation`).
"""

from __future__ import annotations

import logging
import signal

from training.core.metrics import MetricsWriter
from training.parallel import distributed


class StopFlag:
    """Once `catch()`-ing, SIGTERM/SIGINT set a flag; the loop saves a checkpoint and leaves at the end of the step.

    The loop catches from the end of its first step: before, there is nothing to save, and a
    signal keeps its default action, which ends the process at once even inside XLA's first
    compile (a Python handler would run only after it, tens of seconds later).
    """

    def __init__(self):
        self.requested, self.signum, self.previous = False, None, {}

    def catch(self):
        if not self.previous:
            self.previous = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum, frame):
        self.requested, self.signum = True, signum

    def restore(self):
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def interrupted_evaluation(config, writer: MetricsWriter, start: int) -> bool:
    """Whether the dev evaluation at step `start` was cut short by a stop signal (it is redone before training
    goes on): every process agrees."""
    return distributed.agree(
        start > 0
        and start % config.eval_every_steps == 0
        and not any(r["step"] == start and "split" in r for r in writer.records)
    )[0]


def log_stop_during_evaluation(stop: StopFlag, done: int) -> None:
    logging.info(
        "stop requested (signal %s) during the dev evaluation: checkpoint saved at step %d "
        "(the evaluation is redone on resume), exiting",
        stop.signum,
        done,
    )


def stopping(config, done: int, out_of_time: bool, stop_requested: bool, stop: StopFlag) -> bool:
    """Whether training stops after step `done` (out of time, or a stop signal), logged."""
    if out_of_time:
        logging.info(
            "max_train_seconds (%s) reached at step %d: evaluated, checkpointed, stopping",
            config.max_train_seconds,
            done,
        )
        return True
    if stop_requested:
        logging.info("stop requested (signal %s): checkpoint saved at step %d, exiting", stop.signum, done)
        return True
    return False
