"""`sweep.py run --stack_seeds` on a host with 8 devices (8 fake CPU devices): one process trains both seeds of the
point over all of them (seed axis 2 x data 4), and each seed is stored as a run of its own, saying it trained
stacked; `collect` reads it as any run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
CONFIG = "tests/sweeps/tiny_stacked_sweep.py"


def test_a_stacked_sweep_runs_over_eight_devices_and_stores_each_seed(tmp_path):
    if not os.environ.get("MULTI30K_DIR"):
        pytest.skip("MULTI30K_DIR is not set (.ci/run sets it to the shared offline copy)")
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8"}
    workdir, results = tmp_path / "runs", tmp_path / "results"
    args = ["run", "--config", CONFIG, "--workdir", workdir, "--results_dir", results, "--seeds", "2"]
    done = subprocess.run(
        [sys.executable, "sweep.py", *map(str, args), "--stack_seeds", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1500,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[sweep] done h2_seeds0-1" in done.stdout
    for seed in (0, 1):
        result = json.loads((results / "tiny_stacked" / "h2" / f"seed{seed}" / "result.json").read_text())
        assert result["seed"] == seed and result["step"] == 6
        assert result["stacked"]["seeds"] == [0, 1] and result["stacked"]["mesh"] == {"seed": 2, "data": 4}
        assert (results / "tiny_stacked" / "h2" / f"seed{seed}" / "hypotheses.test_2016_flickr.beam4.txt").is_file()
    assert (results / "tiny_stacked.md").is_file()  # collect read the stacked seeds
    # the seeds' own runs, each a whole workdir
    assert sorted(p.name for p in (workdir / "h2_seeds0-1").iterdir() if p.name.startswith("h2_seed")) == [
        "h2_seed0",
        "h2_seed1",
    ]
