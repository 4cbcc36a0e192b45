"""Sweep configs and flags: bad ones are ValueErrors naming the field; the Table 3 sweeps share one preset."""

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from configs import ablation_dk, ablation_heads, ablation_kv
from training.sweeps import store, sweep

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "tests/training/sweeps/tiny_sweep.py"
GOOD = 'SWEEP_NAME = "s"\nSWEEP_KEY = "h"\nSWEEP_VALUES = (1, 2)\nSWEEP_REFERENCE = 2\nSWEEP_TEST_SPLIT = None\ndef get_config(arg=None):\n    return None\n'


def test_bad_sweep_config(tmp_path):
    (tmp_path / "plain.py").write_text("def get_config(arg=None):\n    return None\n")
    with pytest.raises(ValueError, match="lacks SWEEP_NAME"):
        sweep.load_module(tmp_path / "plain.py")
    with pytest.raises(FileNotFoundError, match="no such file"):
        sweep.load_module(tmp_path / "missing.py")
    with pytest.raises(ValueError, match="--seeds"):
        sweep.points(sweep.load_module(CONFIG), 0)


@pytest.mark.parametrize("line, field", [
    ('SWEEP_NAME = "a/b"', "SWEEP_NAME"), ('SWEEP_KEY = "h=1"', "SWEEP_KEY"), ("SWEEP_VALUES = ()", "SWEEP_VALUES"),
    ("SWEEP_VALUES = (1, 1)", "SWEEP_VALUES"), ("SWEEP_VALUES = (0, 2)", "SWEEP_VALUES"), ('SWEEP_VALUES = ("1", 2)', "SWEEP_VALUES"),
    ("SWEEP_REFERENCE = 8", "SWEEP_REFERENCE"), ("SWEEP_TEST_SPLIT = 3", "SWEEP_TEST_SPLIT"),
])
def test_bad_sweep_fields_are_named(tmp_path, line, field):
    path = tmp_path / "bad.py"
    path.write_text(GOOD + line + "\n")
    with pytest.raises(ValueError, match=field):
        sweep.load_module(path)


def test_bad_point_is_named():
    module = sweep.load_module(CONFIG)
    assert sweep.parse_point("h=2", 1, module) == sweep.Point("h", 2, 1)
    for arg in ("kv=2", "h=3", "h=x"):
        with pytest.raises(ValueError, match="--point"):
            sweep.parse_point(arg, 0, module)
    with pytest.raises(ValueError, match="--seed"):
        sweep.parse_point("h=2", -1, module)
    with pytest.raises(ValueError, match="--jobs"):
        sweep.run_sweep(["true"], str(CONFIG), Path("/nonexistent"), Path("/nonexistent"), 1, jobs=0)


def test_slurm_flags_need_the_slurm_launcher(tmp_path):
    done = subprocess.run([sys.executable, "sweep.py", "--config", str(CONFIG), "--workdir", str(tmp_path), "--slurm_gpus", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "--slurm_gpus applies to --launcher slurm only" in done.stderr


def field_of(config, dotted):
    return functools.reduce(getattr, dotted.split("."), config)


def test_table3_sweeps_share_one_preset():
    configs = [ablation_heads.get_config("h=2"), ablation_kv.get_config("kv=1"), ablation_dk.get_config("dk=8")]
    for config in configs[1:]:
        for field in ("num_train_steps", "optimizer.warmup_steps", "optimizer.learning_rate", "model.d_model", "model.num_layers",
                      "model.mlp_dim", "data.vocab_size", "data.token_budget", "seed"):
            assert field_of(config, field) == field_of(configs[0], field), field


def test_dk_sweep_fixes_d_v():
    # d_model 256 at h = 8: d_v = 32, d_k in {8, 16, 32}.
    assert ablation_dk.SWEEP_VALUES == (8, 16, 32) and ablation_dk.SWEEP_REFERENCE == 32
    for dk in (8, 16, 32):
        model = ablation_dk.get_config(f"dk={dk}").model
        assert (model.num_heads, model.head_dim, model.v_head_dim) == (8, dk, 32)
    for arg in ("h=8", "dk=0", "dk=x"):
        with pytest.raises(ValueError, match="dk="):
            ablation_dk.get_config(arg)
    sweep.load_module(ROOT / "configs/ablation_dk.py")  # a valid sweep config


@pytest.mark.slow
def test_a_point_stopped_before_its_last_step_is_not_stored(tmp_path):
    if not os.environ.get("MULTI30K_DIR"):
        pytest.skip("MULTI30K_DIR is not set (.ci/run sets it to the shared offline copy)")
    config = tmp_path / "stopped_sweep.py"  # the tiny sweep, with a time budget that ends training after its first step
    config.write_text(CONFIG.read_text().replace("    return config\n", "    config.max_train_seconds = 1e-6\n    return config\n"))
    module = sweep.load_module(config)
    point = sweep.parse_point("h=2", 0, module)
    assert sweep.run_point(str(config), tmp_path / "runs", point, tmp_path / "results") is None
    assert not store.is_finished(sweep.sweep_dir(tmp_path / "results", module), point)
    assert (tmp_path / "runs" / "h2_seed0" / "checkpoints").is_dir()  # a later start resumes from here
