"""`model.dtype = "auto"`: bfloat16 compute only where it measured faster on the running backend.

bfloat16 pays only where the hardware multiplies it natively (GPUs, TPUs, CPUs with AVX512-BF16 or
AMX); elsewhere XLA emulates it in float32 and it is slower. One quick matmul check decides, once
per machine and `model.matmul` setting (the check times the products the model will run): its
verdict is kept in the compilation cache directory, keyed by the device, the JAX version and that
setting, so every run on a machine resolves "auto" the same way. A run records the dtype it
resolved in its workdir (`RUN_INFO`) and a resumed run keeps it, wherever it resumes.

A program compiled for another target than this host (ahead of time: `bench.aot`) cannot measure
that target: for a GPU or TPU target "auto" resolves to bfloat16 without measuring (every GPU and TPU
the project targets multiplies bfloat16 natively, the case the check exists to find); for a CPU
target it measures this host, as a run would.
"""

from __future__ import annotations

import functools
import json
import logging
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxlib

import backends
from backends import xla_cpu_bf16
from training.core import files

CHOICES_FILE = "headcount-dtype-choices.json"  # in the compilation cache directory: machine key -> verdict
RUN_INFO = "run_info.json"  # in a workdir: how the run's "auto" settings resolved
# bfloat16 must beat float32 by this factor: a tie would buy bfloat16's rounding for nothing.
MIN_SPEEDUP = 1.2
# The check's product, [M, K] @ [K, N] forward and backward: the default model's MLP on a 2048-token batch
# (bigger on an accelerator, where the CPU size is all dispatch).
CPU_SHAPE, ACCELERATOR_SHAPE = (2048, 256, 1024), (8192, 4096, 4096)


def machine_key(matmul: str = "auto") -> str:
    """What the verdict depends on: backend, device, CPU model and bfloat16 flags, JAX and jaxlib versions,
    `model.matmul`."""
    device = jax.devices()[0]
    native = "native bf16" if xla_cpu_bf16.cpu_has_native_bf16() else "no native bf16"
    return (
        f"{device.platform}|{device.device_kind}|{_cpu_model()}, {native}"
        f"|jax {jax.__version__}|jaxlib {jaxlib.__version__}"
        f"|matmul {matmul}"
    )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def matmul_seconds(dtype, shape: tuple[int, int, int], matmul: str = "auto", reps: int = 5) -> float:
    """Median seconds of a dense layer's product and its gradients in `dtype`, with the model's matmuls
    (`model.matmul`) for it."""
    m, k, n = shape
    dot_general = backends.dense_dot_general(matmul, jnp.dtype(dtype)) or jax.lax.dot_general

    def loss(x, w):
        y = dot_general(x.astype(dtype), w.astype(dtype), (((1,), (0,)), ((), ())))
        return jnp.sum(jnp.square(y.astype(jnp.float32)))

    step = jax.jit(jax.grad(loss, argnums=(0, 1)))
    x, w = jax.random.normal(jax.random.key(0), (m, k)), jax.random.normal(jax.random.key(1), (k, n))
    jax.block_until_ready(step(x, w))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(step(x, w))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(matmul: str = "auto") -> dict:
    """float32 and bfloat16 seconds of the check on this backend with `model.matmul`'s products, and the dtype
    they pick."""
    shape = CPU_SHAPE if jax.default_backend() == "cpu" else ACCELERATOR_SHAPE
    f32, bf16 = matmul_seconds(jnp.float32, shape, matmul), matmul_seconds(jnp.bfloat16, shape, matmul)
    return {
        "dtype": "bfloat16" if f32 >= MIN_SPEEDUP * bf16 else "float32",
        "float32_s": f32,
        "bfloat16_s": bf16,
        "shape": list(shape),
        "matmul": matmul,
    }


def machine_choice(cache: Path | None, measure_fn: Callable[[], dict] | None = None, matmul: str = "auto") -> dict:
    """This machine's verdict for `model.matmul`: read from `cache`/CHOICES_FILE, else measured now (and kept there)."""
    key = machine_key(matmul)
    path = cache / CHOICES_FILE if cache is not None else None
    choices = _read_json(path) if path is not None else {}
    if key not in choices:
        choices[key] = {
            **(measure_fn or functools.partial(measure, matmul))(),
            "measured": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        }
        logging.info("model.dtype 'auto': measured %s", choices[key])
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            files.write_atomic(path, json.dumps({**_read_json(path), key: choices[key]}, indent=2))
    return {"machine": key, **choices[key]}


def resolve(
    setting: str,
    cache: Path | None,
    measure_fn: Callable[[], dict] | None = None,
    matmul: str = "auto",
    platform: str | None = None,
) -> str:
    """The compute dtype `model.dtype` names with `model.matmul` ('auto' -> this machine's verdict).

    platform: the target the program is compiled for (None: this process's backend). For a target
    other than XLA:CPU, 'auto' is "bfloat16" without a measurement (the module docstring says why).
    """
    if setting != "auto":
        return setting
    if platform is not None and not backends.is_cpu(platform):
        return "bfloat16"
    return machine_choice(cache, measure_fn, matmul)["dtype"]


def run_dtype(
    setting: str,
    workdir: Path | None,
    cache: Path | None,
    measure_fn: Callable[[], dict] | None = None,
    matmul: str = "auto",
) -> tuple[str, dict]:
    """(the run's compute dtype, its `RUN_INFO` record). A resume keeps the dtype its run started with:
    the one `RUN_INFO` records, or the concrete one an older workdir's config.json holds (workdir None: a fresh run)."""
    recorded = _read_json(workdir / RUN_INFO).get("model.dtype") if workdir else None
    if recorded is not None:
        return recorded["dtype"], {"model.dtype": recorded}
    if setting != "auto":
        return setting, {"model.dtype": {"dtype": setting, "reason": "set in the config"}}
    saved = _read_json(workdir / "config.json").get("model", {}).get("dtype", "auto") if workdir else "auto"
    if saved != "auto":
        return saved, {"model.dtype": {"dtype": saved, "reason": "the workdir's config.json, written before 'auto'"}}
    choice = machine_choice(cache, measure_fn, matmul)
    return choice["dtype"], {
        "model.dtype": {**choice, "reason": f"'auto': bfloat16 only if >= {MIN_SPEEDUP}x faster in the check"}
    }


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}
