"""The CLIs open the CPU alone where the machine shows no accelerator, and start without plugin errors there."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny import train_flags as tiny_flags

from training.core import platforms

ROOT = Path(__file__).resolve().parents[3]
# what JAX's plugins printed on a CPU machine before the CLIs chose the CPU (the CUDA plugin, libtpu)
NOISE = ("Traceback", "plugin configuration error", "could not determine TPU", "Unable to load cuDNN")


def machine(tmp_path: Path, *files: str) -> Path:
    """A file-system root holding `files` (device files, as empty files)."""
    for name in files:
        path = tmp_path / name.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    return tmp_path


def test_the_cpu_alone_only_where_no_accelerator_shows_and_jax_platforms_is_unset(tmp_path):
    assert platforms.platforms_for({}, machine(tmp_path / "cpu")) == "cpu"
    assert platforms.platforms_for({}, machine(tmp_path / "vfio", "/dev/vfio/vfio")) == "cpu"  # VFIO's control file
    for device in ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg", "/dev/kfd", "/dev/accel0", "/dev/vfio/0"):
        root = machine(tmp_path / device.replace("/", "_"), device)
        assert platforms.accelerator_sign({}, root) is not None and platforms.platforms_for({}, root) is None, device
    for name in ("TPU_ACCELERATOR_TYPE", "JAX_FORCE_TPU_INIT", "PJRT_NAMES_AND_LIBRARY_PATHS"):
        assert platforms.platforms_for({name: "1"}, machine(tmp_path / "cpu")) is None, name
    for value in ("", "cuda", "cpu"):  # the user's choice, even empty (JAX chooses), is left alone
        assert platforms.platforms_for({"JAX_PLATFORMS": value}, machine(tmp_path / "cpu")) is None


def cli_environment() -> dict:
    """The suite's environment without JAX_PLATFORMS (conftest sets it): a user's shell on this machine."""
    return {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"} | {"PYTHONPATH": str(ROOT)}


@pytest.mark.skipif(
    not any(importlib.util.find_spec(name) for name in ("jax_plugins.xla_cuda13", "libtpu")),
    reason="neither the CUDA plugin nor libtpu is installed (the aot extra): nothing to be noisy",
)
def test_train_py_starts_without_plugin_errors_when_jax_platforms_is_unset(tmp_path):
    if not os.environ.get("MULTI30K_DIR"):
        pytest.skip("MULTI30K_DIR is not set (.ci/run sets it to the shared offline copy)")
    env = cli_environment()
    assert "JAX_PLATFORMS" not in env
    run = lambda *flags: subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *flags], capture_output=True, text=True, env=env, timeout=600
    )
    helped = run("--help")  # absl prints the help and exits 1
    assert "--workdir" in helped.stdout, helped.stderr[-3000:]
    trained = run(*tiny_flags(1), f"--workdir={tmp_path / 'run'}")
    assert trained.returncode == 0 and "step 1/1" in trained.stderr, trained.stderr[-3000:]
    for done in (helped, trained):
        assert not [n for n in NOISE if n.lower() in done.stderr.lower()], done.stderr[:3000]
