"""Targets and their compile-only devices: the chips a run can be compiled for, and JAX's devices for them.

JAX compiles for TPUs and NVIDIA GPUs it cannot reach. With the `libtpu` wheel installed (the `aot`
extra), `jax.experimental.topologies.get_topology_desc` describes a TPU slice as compile-only
devices; with the CUDA plugin (`jax-cuda13-plugin` and `jax-cuda13-pjrt`, also the `aot` extra) and
CUDA's `ptxas` / `nvlink` on the PATH, it describes GPUs from XLA's target config of the card
(training/run/gpu_targets/, each file naming its source), and XLA compiles for them "deviceless".

Environment: libtpu reads `LIBTPU_ENVIRONMENT` when it loads (`compile_only_devices` sets each
variable not already set): `TPU_SKIP_MDS_QUERY=1` (no metadata server off a TPU VM) and
`ALLOW_MULTIPLE_LIBTPU_LOAD=1` (two processes compiling at once). A script should also start JAX
with `JAX_PLATFORMS=cpu` (`bench.aot` does), so JAX does not try to open a TPU as its backend.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shutil
from pathlib import Path

import numpy as np

GIB = 2**30
LIBTPU_ENVIRONMENT = {"TPU_SKIP_MDS_QUERY": "1", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator kind: its platform, memory a device (GiB) and how its topology is named; for a TPU, its
    peak bfloat16 matrix FLOP/s and HBM bandwidth (bytes/s) a chip (a GPU's rates are its target config's:
    `kernels.Rates`)."""

    platform: str
    name: str
    hbm_gib: float
    topology_rank: int  # TPU: 2 ("2x2") or 3 ("2x2x1"); GPU: 1 (a count of GPUs)
    chip_config_name: str | None = None  # "megacore": one device a chip (its two TensorCores as one)
    target_config: str | None = None  # a GPU's XLA target config, a file in gpu_targets/
    peak_flops: float | None = None  # TPU: bfloat16 FLOP/s a chip
    hbm_bandwidth: float | None = None  # TPU: HBM bytes/s a chip


GPU_TARGETS = Path(__file__).parents[1] / "gpu_targets"  # training/run/gpu_targets/


def _gpu(name: str, target_config: str) -> Chip:
    """A GPU whose memory is its target config's `device_memory_size` (read as GiB)."""
    found = re.search(r"device_memory_size:\s*(\d+)", (GPU_TARGETS / target_config).read_text())
    return Chip("cuda", name, round(int(found[1]) / GIB, 1), 1, target_config=target_config)


# HBM a chip, as Google Cloud's TPU system-architecture pages state it (cloud.google.com/tpu/docs/v4,
# /v5e, /v5p, /v6e), read as GiB. v4 and v5p compile as megacore: one device is a whole chip. Peak bfloat16
# FLOP/s and HBM bandwidth a chip, from the same pages' specification tables (vendor peaks, not measured):
# v4 275 TFLOP/s, 1,200 GB/s; v5e 197 TFLOP/s, 819 GB/s; v5p 459 TFLOP/s, 2,765 GB/s; v6e 918 TFLOP/s, 1,640 GB/s.
CHIPS = {
    "v4": Chip("tpu", "v4", 32, 3, "megacore", peak_flops=275e12, hbm_bandwidth=1200e9),
    "v5e": Chip("tpu", "v5e", 16, 2, peak_flops=197e12, hbm_bandwidth=819e9),
    "v5p": Chip("tpu", "v5p", 95, 3, "megacore", peak_flops=459e12, hbm_bandwidth=2765e9),
    "v6e": Chip("tpu", "v6e", 32, 2, peak_flops=918e12, hbm_bandwidth=1640e9),
    "h100": _gpu("h100", "h100_sxm.txtpb"),
    "h200": _gpu("h200", "h200.txtpb"),
}
HBM_SOURCES = {
    "tpu": "Google Cloud TPU system architecture pages (cloud.google.com/tpu/docs/v4, v5e, v5p, v6e): HBM per chip",
    "cuda": "XLA's GPU target config (training/run/gpu_targets/): device_memory_size",
}


@dataclasses.dataclass(frozen=True)
class Target:
    """`tpu:CHIP[:TOPOLOGY]` (tpu:v5e:2x2 is 4 chips, tpu:v4:2x2x1) or `cuda:GPU[:COUNT]` (cuda:h100,
    cuda:h200:8); one chip by default."""

    chip: Chip
    topology: str

    @property
    def name(self) -> str:
        return f"{self.chip.platform}:{self.chip.name}:{self.topology}"

    @property
    def num_devices(self) -> int:
        return int(np.prod([int(n) for n in self.topology.split("x")]))


def parse_target(text: str) -> Target:
    """'tpu:v5e:2x2' or 'cuda:h100:8' -> Target; ValueError naming --target, the value and what is expected."""
    parts = text.split(":") if isinstance(text, str) else []
    tpus = tuple(n for n, c in CHIPS.items() if c.platform == "tpu")
    gpus = tuple(n for n, c in CHIPS.items() if c.platform == "cuda")
    expected = (
        f"'tpu:CHIP[:TOPOLOGY]' with CHIP one of {tpus} (tpu:v5e:2x2, tpu:v4:2x2x1) or "
        f"'cuda:GPU[:COUNT]' with GPU one of {gpus} (cuda:h100, cuda:h200:8)"
    )
    if len(parts) not in (2, 3) or parts[1] not in CHIPS or CHIPS[parts[1]].platform != parts[0]:
        raise ValueError(f"--target = {text!r}; expected {expected}")
    chip = CHIPS[parts[1]]
    topology = parts[2] if len(parts) == 3 else "x".join("1" * chip.topology_rank)
    dims = topology.split("x")
    if len(dims) != chip.topology_rank or not all(d.isdigit() and int(d) > 0 for d in dims):
        shape = "COUNT (GPUs)" if chip.platform == "cuda" else "x".join(["N"] * chip.topology_rank) + " (chips a side)"
        raise ValueError(f"--target = {text!r}: topology {topology!r}; a {chip.name} target is named {shape}")
    return Target(chip, topology)


def parse_mesh(text: str) -> tuple[int, int]:
    """'2,2' -> (data 2, model 2); ValueError naming --mesh otherwise."""
    try:
        data, model = (int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--mesh = {text!r}; expected DATA,MODEL as two ints (-1: the rest), e.g. 2,2") from None
    return data, model


def has_libtpu() -> bool:
    """Whether the `libtpu` wheel (the `aot` extra) is installed: TPU targets need it."""
    return importlib.util.find_spec("libtpu") is not None


def has_cuda_compiler() -> bool:
    """Whether GPU targets can compile here: the CUDA plugin (the `aot` extra) and CUDA's ptxas and nvlink."""
    return importlib.util.find_spec("jax_plugins.xla_cuda13") is not None and all(
        shutil.which(tool) for tool in ("ptxas", "nvlink")
    )


def compile_only_devices(target: Target) -> list:
    """The target's devices, for compiling only (`jax.experimental.topologies`)."""
    from jax.experimental import topologies

    if target.chip.platform == "cuda":
        if not has_cuda_compiler():
            raise ValueError(
                f"--target = {target.name!r} needs the CUDA plugin (pip install -c requirements.lock -e "
                f"'.[aot]') and CUDA's ptxas and nvlink on the PATH (a CUDA toolkit, or pip's nvidia-cuda-nvcc)"
            )
        text = (GPU_TARGETS / target.chip.target_config).read_text()
        return list(
            topologies.get_topology_desc(
                platform="cuda", target_config=text, topology=f"1x1x{target.num_devices}"
            ).devices
        )
    if not has_libtpu():
        raise ValueError(
            f"--target = {target.name!r} needs the libtpu wheel: pip install -c requirements.lock -e '.[aot]'"
        )
    for name, value in LIBTPU_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    kwargs = {"chip_config_name": target.chip.chip_config_name} if target.chip.chip_config_name else {}
    return list(
        topologies.get_topology_desc(
            topology_name=f"{target.chip.name}:{target.topology}", platform="tpu", **kwargs
        ).devices
    )
