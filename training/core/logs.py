"""What a training process logs: its own progress at INFO; per-parameter detail and libraries' INFO only when
verbose."""

from __future__ import annotations

import logging

# Loggers of libraries that narrate at INFO (orbax through absl's logger, JAX's backend probing).
LIBRARIES = ("absl", "jax", "orbax")


def configure(*, verbose: bool, main_process: bool) -> None:
    """Set the levels once, in a CLI's main: process 0 logs progress, the others only warnings."""
    logging.getLogger().setLevel(logging.INFO if main_process else logging.WARNING)
    logging.getLogger("training").setLevel(logging.DEBUG if verbose and main_process else logging.NOTSET)
    for name in LIBRARIES:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.WARNING)
