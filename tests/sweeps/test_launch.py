"""The SLURM options reach submitit's sbatch script; bad options and sweep configs are named errors."""

import os

import pytest
from submitit.slurm.slurm import _make_sbatch_string

from sweeps import launch


def test_slurm_options_reach_the_sbatch_script(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"  # submitit's SLURM executor wants an srun on PATH; nothing runs it here
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    ex = launch.executor(tmp_path, launch.SlurmOptions(partition="gpu-a100", gpus=2, time_min=90, cpus=8))
    script = _make_sbatch_string(command="true", folder=tmp_path, **ex._executor.parameters)
    for line in (
        "#SBATCH --partition=gpu-a100",
        "#SBATCH --gpus-per-node=2",
        "#SBATCH --time=90",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=1",
    ):
        assert line in script


@pytest.mark.parametrize(
    "field, value", [("gpus", -1), ("time_min", 0), ("cpus", 0), ("time_min", 1.5), ("partition", "a b")]
)
def test_bad_slurm_options_are_named(field, value):
    with pytest.raises(ValueError, match=f"--slurm_{field}"):
        launch.SlurmOptions(**{field: value})


def test_unknown_cluster(tmp_path):
    with pytest.raises(ValueError, match="cluster"):
        launch.executor(tmp_path, launch.SlurmOptions(), cluster="pbs")
