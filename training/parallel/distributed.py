"""Multi-process start-up (`jax.distributed`) and the few places where process 0 acts alone."""

from __future__ import annotations

import logging
import os

import jax
import numpy as np
from jax.experimental import multihost_utils

MODES = ("auto", "always", "never")


def check(distributed) -> None:
    """ValueError naming the first bad field of the config's `distributed` section."""
    if distributed.initialize not in MODES:
        raise ValueError(f"config.distributed.initialize = {distributed.initialize!r}; expected one of {MODES}")
    if not isinstance(distributed.num_processes, int) or distributed.num_processes < 0:
        raise ValueError(
            f"config.distributed.num_processes = {distributed.num_processes!r}; "
            "expected an int >= 0 (0: from the environment)"
        )
    if not isinstance(distributed.process_id, int) or distributed.process_id < -1:
        raise ValueError(
            f"config.distributed.process_id = {distributed.process_id!r}; "
            "expected an int >= -1 (-1: from the environment)"
        )
    if distributed.num_processes and distributed.process_id >= distributed.num_processes:
        raise ValueError(
            f"config.distributed.process_id = {distributed.process_id}; "
            f"expected < num_processes ({distributed.num_processes})"
        )
    address = distributed.coordinator_address
    if address and ":" not in address:
        raise ValueError(
            f"config.distributed.coordinator_address = {address!r}; expected 'host:port' or '' (from the environment)"
        )


def requested(distributed, environ=os.environ) -> bool:
    """Whether to call `jax.distributed.initialize`: 'always', or 'auto' when a coordinator or a multi-task SLURM
    job is set."""
    if distributed.initialize != "auto":
        return distributed.initialize == "always"
    slurm_tasks = int(environ.get("SLURM_NTASKS", "1") or 1)
    return bool(distributed.coordinator_address or environ.get("JAX_COORDINATOR_ADDRESS") or slurm_tasks > 1)


def initialize(distributed) -> None:
    """Join the other processes when asked; unset fields are left to JAX's detection (Cloud TPU, SLURM, env)."""
    check(distributed)
    if not requested(distributed):
        return
    jax.distributed.initialize(
        coordinator_address=distributed.coordinator_address or None,
        num_processes=distributed.num_processes or None,
        process_id=None if distributed.process_id < 0 else distributed.process_id,
    )
    logging.warning(
        "process %d of %d: %d local devices, %d in all",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )


def is_main() -> bool:
    return jax.process_index() == 0


def main_first(name: str, fn):
    """Run `fn()` on process 0, then on the others (which find what it wrote in the shared workdir)."""
    if jax.process_count() == 1:
        return fn()
    result = fn() if is_main() else None
    multihost_utils.sync_global_devices(name)
    return result if is_main() else fn()


def broadcast_bytes(data: bytes | None) -> bytes:
    """Process 0's `data` on every process (the others pass None)."""
    if jax.process_count() == 1:
        return data
    size = int(multihost_utils.broadcast_one_to_all(np.array(len(data) if is_main() else 0, dtype=np.int64)))
    buffer = np.frombuffer(data, dtype=np.uint8) if is_main() else np.zeros(size, dtype=np.uint8)
    return multihost_utils.broadcast_one_to_all(buffer).astype(np.uint8).tobytes()


def agree(*flags: bool) -> tuple[bool, ...]:
    """Process 0's values of `flags` on every process: clocks and signals differ, but all must stop together."""
    if jax.process_count() == 1:
        return flags
    return tuple(bool(x) for x in multihost_utils.broadcast_one_to_all(np.array(flags, dtype=np.int32)))
