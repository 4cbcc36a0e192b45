"""Which platforms JAX opens in a CLI process: the CPU alone on a machine that shows no accelerator.

Left to itself, JAX opens every platform it finds installed when a process first touches a device. The `aot`
extra installs libtpu and the CUDA plugin (to compile for TPUs and GPUs on a CPU machine: training/run/aot/),
so on a machine with neither device a start printed the CUDA plugin's failed version check (a traceback ending
"Unable to load cuDNN"), then loaded libtpu, which printed its own warnings ("could not determine TPU worker
hostnames") and held libtpu's lock file for the rest of the process. `jax_platforms = 'cpu'` makes JAX open the
CPU alone: the CUDA plugin skips its check and still registers (compiling for a GPU target works), and libtpu is
loaded only when asked for (a TPU topology to compile for).

`choose()` sets it, through `jax.config`, when `JAX_PLATFORMS` is unset and nothing on the machine suggests an
accelerator: no NVIDIA, AMD or TPU device file and none of the environment variables that point JAX at one.
Any such sign leaves the choice to JAX as before, so the signs are broad: a false one costs the old noise, a
missed accelerator would train on the CPU. `JAX_PLATFORMS` set, even empty, is the user's choice and wins.
Looking costs a few `stat` calls and never imports JAX. The setting is this process's alone (not the environment):
a sweep submitted from a CPU login node leaves its GPU jobs to look for themselves.

The CLIs (train.py, eval.py, sweep.py, analyze.py) call `choose()` before anything touches a device (their imports
never do; jax.distributed relies on the same). A plain `import jax` outside them has no such hook: there
`JAX_PLATFORMS=cpu` quiets it (docs/training.md, "What a start prints").
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping
from pathlib import Path

# NVIDIA GPUs (the control device in containers, WSL2's dxg, as JAX's own check), AMD ROCm's kfd
DEVICE_FILES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg", "/dev/kfd")
# TPU chips: accel devices (v2 to v4) or VFIO groups (v5e and later); /dev/vfio/vfio alone is VFIO's control file
DEVICE_PATTERNS = ("/dev/accel*", "/dev/vfio/[0-9]*", "/dev/vfio/devices/*")
# set where JAX is told to look for an accelerator: forced TPU start, a TPU pod's topology, a plugin, a proxy
ENVIRONMENT = (
    "JAX_FORCE_TPU_INIT",
    "TPU_ACCELERATOR_TYPE",
    "TPU_WORKER_HOSTNAMES",
    "PJRT_NAMES_AND_LIBRARY_PATHS",
    "JAX_BACKEND_TARGET",
)


def accelerator_sign(environ: Mapping[str, str] = os.environ, root: str | Path = "/") -> str | None:
    """The first device file (under `root`) or environment variable that suggests an accelerator, else None."""
    for name in ENVIRONMENT:
        if environ.get(name):
            return name
    for path in DEVICE_FILES:
        if Path(root, path.lstrip("/")).exists():
            return path
    for pattern in DEVICE_PATTERNS:
        if glob.glob(str(Path(root, pattern.lstrip("/")))):
            return pattern
    return None


def platforms_for(environ: Mapping[str, str] = os.environ, root: str | Path = "/") -> str | None:
    """'cpu' when `JAX_PLATFORMS` is unset and no accelerator sign is found, else None (JAX chooses)."""
    if "JAX_PLATFORMS" in environ or accelerator_sign(environ, root):
        return None
    return "cpu"


def choose() -> str | None:
    """Set `jax_platforms` to `platforms_for()` for this process when it names one; return what was set."""
    chosen = platforms_for()
    if chosen:
        import jax

        jax.config.update("jax_platforms", chosen)
    return chosen
